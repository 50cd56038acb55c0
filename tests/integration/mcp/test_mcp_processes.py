"""Background processes through MCP on a real `execbox serve` (jail boxes), driven by the mcp SDK's
client: a started server answers later calls and is gone after kill_process; output is read
incrementally from the offsets each reply gives, capped per read and never repeated or lost;
stdin reaches the process; unknown pids and sessions are SB002 naming what was wrong."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from execbox.mcp.output_cap import DEFAULT_MAX_OUTPUT
from tests.integration.mcp.conftest import http_client, run_async

pytestmark = pytest.mark.jail

FETCH = ("python3 -c \"import urllib.request as u; "
         "print(u.urlopen('http://127.0.0.1:8765/hello.txt', timeout=5).read().decode())\"")
SERVE = "python3 -m http.server 8765 --bind 127.0.0.1"


def _text(result: Any) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def _error(result: Any) -> dict[str, Any]:
    assert result.is_error, _text(result)
    return result.structured_content["error"]


def test_a_started_server_answers_other_calls_and_is_gone_after_kill(service) -> None:
    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_a) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            out: dict[str, Any] = {"sid": sid}
            await c.call_tool("write_file", {"session_id": sid, "path": "site/hello.txt", "content": "hi there"})
            started = out["start"] = await c.call_tool(
                "start_process", {"session_id": sid, "command": SERVE, "cwd": "site", "wait": 0})
            pid = started.structured_content["pid"]
            for _ in range(50):  # until the server listens
                out["fetch"] = await c.call_tool("run_command", {"session_id": sid, "command": FETCH})
                if out["fetch"].structured_content["exit_code"] == 0:
                    break
            out["listed"] = await c.call_tool("list_processes", {"session_id": sid})
            out["log"] = await c.call_tool("read_process_output", {"session_id": sid, "pid": pid, "wait": 5})
            out["kill"] = await c.call_tool("kill_process", {"session_id": sid, "pid": pid})
            out["after"] = await c.call_tool("run_command", {"session_id": sid, "command": FETCH})
            out["listed_after"] = await c.call_tool("list_processes", {"session_id": sid})
            out["kill_again"] = await c.call_tool("kill_process", {"session_id": sid, "pid": pid})
            await c.call_tool("close_session", {"session_id": sid})
            return out

    out = run_async(go)
    start = out["start"]
    assert not start.is_error and start.structured_content["running"] is True, _text(start)
    assert start.structured_content["session_id"] == out["sid"] and "kill_process" in _text(start)
    assert out["fetch"].structured_content["stdout"] == "hi there\n"
    [listed] = out["listed"].structured_content["processes"]
    assert listed["pid"] == start.structured_content["pid"] and listed["status"] == "running"
    assert "GET /hello.txt" in out["log"].structured_content["stderr"]  # the server's access log
    kill = out["kill"]
    assert not kill.is_error and kill.structured_content["running"] is False, _text(kill)
    assert kill.structured_content["status"] == "signalled" and kill.structured_content["signal"] == 15
    assert "it has ended" in _text(kill)
    assert out["after"].structured_content["exit_code"] != 0  # nothing listens any more
    assert "Connection refused" in out["after"].structured_content["stderr"]
    [ended] = out["listed_after"].structured_content["processes"]
    assert ended["running"] is False and ended["status"] == "signalled"
    assert "already ended" in _text(out["kill_again"])


def test_output_is_read_incrementally_from_offsets_and_stdin_reaches_the_process(service) -> None:
    big = "seq 1 30000"  # 168 894 bytes: more than one read's cap
    chat = "echo ready; read a; echo got:$a; read b; echo got:$b >&2"

    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_b) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            out: dict[str, Any] = {}
            first = out["first"] = await c.call_tool("start_process", {"session_id": sid, "command": big, "wait": 5})
            pid, reads, got = first.structured_content["pid"], [first], first.structured_content
            for _ in range(200):  # until the box has reported it over, so the next read is cut by the cap
                [listed] = (await c.call_tool("list_processes", {"session_id": sid})).structured_content["processes"]
                if listed.get("exited_in_box") or not listed["running"]:
                    break
                await asyncio.sleep(0.05)
            while got["running"] or got["stdout_waiting"]:
                reads.append(await c.call_tool("read_process_output", {
                    "session_id": sid, "pid": pid, "stdout_offset": got["stdout_offset"],
                    "stderr_offset": got["stderr_offset"], "wait": 5}))
                got = reads[-1].structured_content
                assert len(reads) < 100
            out["reads"] = reads
            out["again"] = await c.call_tool("read_process_output", {
                "session_id": sid, "pid": pid, "stdout_offset": got["stdout_offset"]})
            talk = await c.call_tool("start_process", {"session_id": sid, "command": chat, "stdin": True})
            tpid = talk.structured_content["pid"]
            out["talk"] = talk
            out["line"] = await c.call_tool("write_process_input", {"session_id": sid, "pid": tpid, "data": "one\n"})
            out["read1"] = await c.call_tool("read_process_output", {
                "session_id": sid, "pid": tpid, "stdout_offset": talk.structured_content["stdout_offset"],
                "wait": 10})
            out["last"] = await c.call_tool("write_process_input", {
                "session_id": sid, "pid": tpid, "data": "dHdv", "encoding": "base64", "close": True})
            got = out["read1"].structured_content
            out["tail"] = []
            for _ in range(10):  # stdin closed: it reads end-of-file and ends
                if not got["running"]:
                    break
                out["tail"].append(await c.call_tool("read_process_output", {
                    "session_id": sid, "pid": tpid, "stdout_offset": got["stdout_offset"],
                    "stderr_offset": got["stderr_offset"], "wait": 5}))
                got = out["tail"][-1].structured_content
            out["closed"] = await c.call_tool("write_process_input", {"session_id": sid, "pid": tpid, "data": "x"})
            await c.call_tool("close_session", {"session_id": sid})
            return out

    out = run_async(go)
    reads = [r.structured_content for r in out["reads"]]
    whole = "".join(r["stdout"] for r in reads)
    assert whole == "".join(f"{i}\n" for i in range(1, 30001))  # nothing lost, nothing repeated
    assert len(reads) >= 6 and all(len(r["stdout"]) <= DEFAULT_MAX_OUTPUT for r in reads)
    # the first reply returns with the first output the service has, so how much waits behind it
    # depends on timing; the second read comes after the box reported the process over: cut by the cap
    assert (f"next read: read_process_output pid={reads[0]['pid']} stdout_offset={reads[0]['stdout_offset']} "
            "stderr_offset=0") in _text(out["first"])  # how to read on, in the model's text
    second = reads[1]
    assert len(second["stdout"]) > DEFAULT_MAX_OUTPUT - 8 and second["stdout_waiting"] > 0, second
    assert f"[{second['stdout_waiting']} more bytes of stdout are waiting: read on]" in _text(out["reads"][1])
    assert (f"next read: read_process_output pid={second['pid']} stdout_offset={second['stdout_offset']} "
            f"stderr_offset={second['stderr_offset']}") in _text(out["reads"][1])
    assert reads[-1]["status"] == "exited" and reads[-1]["exit_code"] == 0
    assert "exited with code 0" in _text(out["reads"][-1])
    assert out["again"].structured_content["stdout"] == "" and "(no new output)" in _text(out["again"])
    assert out["talk"].structured_content["stdout"] == "ready\n"
    assert out["line"].structured_content["written"] == 4
    assert out["read1"].structured_content["stdout"] == "got:one\n"
    assert out["last"].structured_content["stdin"] is False
    tail = [r.structured_content for r in out["tail"]]
    assert "".join(t["stdout"] for t in tail) == "" and "".join(t["stderr"] for t in tail) == "got:two\n"
    assert tail[-1]["status"] == "exited" and tail[-1]["exit_code"] == 0
    err = _error(out["closed"])
    assert err["code"] == "SB002" and err["details"]["field"] == "pid" and "has ended" in err["message"]


def test_bad_process_requests_are_sb002_naming_what_was_wrong(service) -> None:
    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_a) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            no_stdin = await c.call_tool("start_process", {"session_id": sid, "command": "sleep 30", "wait": 0})
            out = {
                "pid": await c.call_tool("read_process_output", {"session_id": sid, "pid": 999999}),
                "kill_pid": await c.call_tool("kill_process", {"session_id": sid, "pid": 999999}),
                "session": await c.call_tool("start_process", {"session_id": "no-such-session", "command": "true"}),
                "list_session": await c.call_tool("list_processes", {"session_id": "no-such-session"}),
                "cwd": await c.call_tool("start_process", {"session_id": sid, "command": "true", "cwd": "../.."}),
                "signal": await c.call_tool("kill_process", {"session_id": sid, "pid": 1, "signal": "SIGSTOP"}),
                "stdin": await c.call_tool("write_process_input", {
                    "session_id": sid, "pid": no_stdin.structured_content["pid"], "data": "x"}),
                "fresh": await c.call_tool("read_process_output", {"pid": 1}),  # no conversation session yet
            }
            await c.call_tool("close_session", {"session_id": sid})
            return out

    out = run_async(go)
    for name in ("pid", "kill_pid"):
        err = _error(out[name])
        assert err["code"] == "SB002" and err["details"]["field"] == "pid" and "999999" in err["message"]
    for name in ("session", "list_session"):
        err = _error(out[name])
        assert err["code"] == "SB002" and err["details"]["session_id"] == "no-such-session", err
    assert _error(out["cwd"])["code"] == "SB002" and _error(out["cwd"])["details"]["field"] == "cwd"
    err = _error(out["signal"])
    assert err["code"] == "SB002" and err["details"]["field"] == "signal" and "SIGTERM" in err["details"]["allowed"]
    err = _error(out["stdin"])
    assert err["code"] == "SB002" and "without stdin" in err["message"]
    err = _error(out["fresh"])
    assert err["code"] == "SB002" and err["details"]["field"] == "pid" and "no session yet" in err["message"]


def test_a_process_over_in_the_box_says_so_while_its_output_waits(service) -> None:
    """Review 32, F7: a read keeps the output in the box, and the process said `running` until
    all of it had been read, though it had exited long before; now it says it exited in the box
    and how much is left, and reading on still gives every byte, then its exit code."""
    want = "".join(f"{i}\n" for i in range(1, 300_001)).encode()  # 1 988 895 bytes: more than a stream holds

    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_b) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            first = await c.call_tool("start_process", {"session_id": sid, "command": "seq 1 300000", "wait": 0})
            got, pid = first.structured_content, first.structured_content["pid"]
            data, seen = [got["stdout"]], None
            for _ in range(100):  # until the box reports the end (seq takes well under a second)
                r = await c.call_tool("read_process_output", {"session_id": sid, "pid": pid, "wait": 0,
                                                              "stdout_offset": got["stdout_offset"]})
                got = r.structured_content
                data.append(got["stdout"])
                if got.get("exited_in_box"):
                    seen = r
                    break
                await asyncio.sleep(0.1)
            listed = await c.call_tool("list_processes", {"session_id": sid})
            while got["running"] or got["stdout_waiting"]:
                r = await c.call_tool("read_process_output", {"session_id": sid, "pid": pid, "wait": 5,
                                                              "stdout_offset": got["stdout_offset"]})
                got = r.structured_content
                data.append(got["stdout"])
                assert len(data) < 400
            await c.call_tool("close_session", {"session_id": sid})
            return {"seen": seen, "listed": listed, "last": got, "data": "".join(data)}

    out = run_async(go)
    seen = out["seen"]
    assert seen is not None, "the box's end was never reported while output waited"
    sc = seen.structured_content
    assert sc["running"] is True and sc["exited_in_box"] is True and sc["stdout_size"] == len(want)
    assert sc["stdout_waiting"] == len(want) - sc["stdout_offset"] > 0
    assert f"exited in the box, {sc['stdout_waiting']} bytes of output left to read" in _text(seen), _text(seen)
    assert "exited in the box" in _text(out["listed"]), _text(out["listed"])
    last = out["last"]
    assert last["running"] is False and last["status"] == "exited" and last["exit_code"] == 0
    assert "exited_in_box" not in last
    assert out["data"].encode() == want  # every byte, none repeated
