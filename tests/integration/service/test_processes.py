"""Background processes over the HTTP API (routes/processes.py), on a real service over the jail:
a process runs beside runs and file operations without holding the session, serves a port that
runs in the box reach, streams its output through offsets without loss or duplication, takes
stdin, signals and a timeout (whole job), is confined to its tenant, and is audited. The remote
SDKs' ``commands.run(background=True)`` use it (sync and async)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from execbox import AsyncProcessHandle, AsyncRemoteSandbox, ExecutionTimeoutError, ProcessHandle, RemoteSandbox
from execbox.sdk import process_handles

from .conftest import Service, free_port

A = "/v1/sandbox/sessions/tenant-a"


def _until(check: Callable[[], Any], seconds: float = 20, what: str = "condition") -> Any:
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} not met in time"
        time.sleep(0.05)


def _start(c: httpx.Client, session: str, command: str, **kw: Any) -> int:
    r = c.post(f"{A}/{session}/processes", json={"command": command, **kw})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["command"] == command and body["started_at"] > 0  # a quick one may have ended already
    assert body["status"] in ("running", "exited") and body["running"] is (body["status"] == "running")
    return int(body["pid"])


def _read_all(c: httpx.Client, session: str, pid: int, encoding: str = "text") -> tuple[Any, Any, dict[str, Any]]:
    """Follow a process to its end with offsets and long-polls; (stdout, stderr, last answer)."""
    out: Any = b"" if encoding == "base64" else ""
    err: Any = b"" if encoding == "base64" else ""
    offs = {"stdout_offset": 0, "stderr_offset": 0}
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "the process did not end"
        r = c.get(f"{A}/{session}/processes/{pid}", params={**offs, "wait": 5, "encoding": encoding})
        assert r.status_code == 200, r.text
        j = r.json()
        assert j["stdout_skipped"] == 0 and j["stderr_skipped"] == 0
        if encoding == "base64":
            out += base64.b64decode(j["stdout"])
            err += base64.b64decode(j["stderr"])
        else:
            out += j["stdout"]
            err += j["stderr"]
        offs = {"stdout_offset": j["stdout_offset"], "stderr_offset": j["stderr_offset"]}
        if not j["running"]:
            return out, err, j


@pytest.fixture
def a(service: Service) -> Iterator[httpx.Client]:
    yield service.a


def test_a_server_process_runs_beside_runs_and_files_and_answers_on_its_port(a: httpx.Client) -> None:
    port = free_port()
    r = a.post("/v1/sandbox/write", json={"session_id": "srv", "path": "www/hello.txt", "content": "from-box"})
    assert r.status_code == 200, r.text
    pid = _start(a, "srv", f"exec python3 -u -m http.server {port} --bind 127.0.0.1 --directory www")
    fetch = (f"import time, urllib.request\nfor _ in range(200):\n    try:\n"
             f"        print(urllib.request.urlopen('http://127.0.0.1:{port}/hello.txt', timeout=2).read().decode())\n"
             f"        break\n    except OSError:\n        time.sleep(0.05)\n")
    started = time.monotonic()
    r = a.post("/v1/sandbox/execute", json={"session_id": "srv", "code": fetch, "timeout": 30})
    assert r.status_code == 200, r.text
    assert r.json()["stdout"] == "from-box\n"  # a run in the box reached the process's port
    assert time.monotonic() - started < 25  # it did not wait for the (endless) server
    url = f"http://127.0.0.1:{port}/hello.txt"
    get = (f"curl -s {url} || python3 -c \"import urllib.request as u; "
           f"print(u.urlopen('{url}').read().decode(), end='')\"")
    r = a.post("/v1/sandbox/bash", json={"session_id": "srv", "command": get})
    assert r.status_code == 200 and r.json()["stdout"] == "from-box", r.text
    assert a.post("/v1/sandbox/write", json={"session_id": "srv", "path": "x.txt", "content": "y"}).status_code == 200
    other = _start(a, "srv", "echo second")  # another process beside the first
    _, _, end = _read_all(a, "srv", other)
    assert end["exit_code"] == 0
    listed = a.get(f"{A}/srv/processes").json()["processes"]
    by_pid = {p["pid"]: p for p in listed}
    assert by_pid[pid]["running"] is True and by_pid[other]["status"] == "exited"
    # the server logged the two requests on stderr, readable by offset while it runs
    log = _until(lambda: (j := a.get(f"{A}/srv/processes/{pid}").json())["stderr"].count("GET /hello.txt") == 2 and j,
                 what="two access-log lines")
    assert log["running"] is True and log["stderr_offset"] > 0
    r = a.post(f"{A}/srv/processes/{pid}/signal", json={"signal": "SIGTERM"})
    assert r.status_code == 200 and r.json()["signalled"] is True, r.text
    _, _, end = _read_all(a, "srv", pid)
    assert end["status"] == "signalled" and end["signal"] == 15 and end["exit_code"] == -15


def test_a_process_runs_while_a_run_holds_the_session(a: httpx.Client) -> None:
    """Starting, reading and signalling a process go beside a run that holds the session."""
    code = "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.05)\nprint('released')"
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(a.post, "/v1/sandbox/execute", json={"session_id": "held", "code": code, "timeout": 40})
        _until(lambda: a.post("/v1/sandbox/list", json={"session_id": "held", "path": "."}).status_code == 200)
        time.sleep(0.5)
        pid = _start(a, "held", "echo beside; touch go")
        out, _, end = _read_all(a, "held", pid)
        assert (out, end["exit_code"]) == ("beside\n", 0)
        assert run.result(timeout=30).json()["stdout"] == "released\n"


def test_output_by_offsets_has_no_loss_no_duplication_and_whole_characters(a: httpx.Client) -> None:
    n = 3000
    cmd = (f"for i in $(seq 1 {n}); do echo out-$i; echo err-$i >&2; "
           "if [ $((i % 500)) -eq 0 ]; then sleep 0.1; fi; done; "
           r"printf '\xc3'; sleep 0.4; printf '\xa9\n'; exit 5")  # 'é' split across writes
    pid = _start(a, "out", cmd)
    out, err, end = _read_all(a, "out", pid)
    assert out == "".join(f"out-{i}\n" for i in range(1, n + 1)) + "é\n"  # never a half character
    assert err == "".join(f"err-{i}\n" for i in range(1, n + 1))
    assert (end["status"], end["exit_code"], end["stdout_offset"]) == ("exited", 5, len(out.encode()))
    # the same bytes through base64
    pid = _start(a, "out", r"printf 'a\x00\xffb'")
    raw, _, end = _read_all(a, "out", pid, "base64")
    assert raw == b"a\x00\xffb" and end["exit_code"] == 0
    # an ended process stays readable; an offset acknowledges what lies before it, which a read
    # from an earlier offset then reports as skipped
    pid = _start(a, "out", r"printf 'a\x00\xffb'")
    _until(lambda: {p["pid"]: p for p in a.get(f"{A}/out/processes").json()["processes"]}[pid]["status"] == "exited")
    for offset, skipped in ((2, 0), (0, 2)):
        again = a.get(f"{A}/out/processes/{pid}", params={"stdout_offset": offset, "encoding": "base64"}).json()
        assert base64.b64decode(again["stdout"]) == b"\xffb" and again["running"] is False
        assert (again["stdout_skipped"], again["stdout_offset"]) == (skipped, 4)


def test_long_poll_waits_for_output_instead_of_answering_empty(a: httpx.Client) -> None:
    pid = _start(a, "poll", "sleep 1; echo late")
    started = time.monotonic()
    j = a.get(f"{A}/poll/processes/{pid}", params={"wait": 20}).json()
    assert j["stdout"] == "late\n" and 0.5 < time.monotonic() - started < 15
    r = a.get(f"{A}/poll/processes/{pid}", params={"wait": 61})
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "wait"


def test_stdin_round_trip_and_close(a: httpx.Client) -> None:
    upper = "python3 -u -c \"import sys\nfor line in sys.stdin: print(line.strip().upper(), flush=True)\nprint('eof')\""
    pid = _start(a, "in", upper, stdin=True)
    r = a.post(f"{A}/in/processes/{pid}/stdin", json={"data": "hello\n"})
    assert r.status_code == 200 and r.json() == {"pid": pid, "written": 6, "stdin": True}, r.text
    assert _until(lambda: a.get(f"{A}/in/processes/{pid}", params={"wait": 5}).json()["stdout"]) == "HELLO\n"
    r = a.post(f"{A}/in/processes/{pid}/stdin", json={"data_b64": base64.b64encode(b"bytes\n").decode(),
                                                         "close": True})
    assert r.status_code == 200 and r.json()["stdin"] is False, r.text
    out, _, end = _read_all(a, "in", pid)
    assert out == "HELLO\nBYTES\neof\n" and end["exit_code"] == 0
    r = a.post(f"{A}/in/processes/{pid}/stdin", json={"data": "late\n"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "SB002"
    no_stdin = _start(a, "in", "sleep 30")
    r = a.post(f"{A}/in/processes/{no_stdin}/stdin", json={"data": "x"})
    assert r.status_code == 409 and "without stdin" in r.json()["error"]["message"]
    for bad, field in (({"data": "x", "data_b64": "eA=="}, "data"), ({}, "data"), ({"data_b64": "%%"}, "data_b64")):
        r = a.post(f"{A}/in/processes/{no_stdin}/stdin", json=bad)
        assert r.status_code == 400 and r.json()["error"]["details"]["field"] == field, (bad, r.text)
    assert a.post(f"{A}/in/processes/{no_stdin}/signal", json={"signal": "KILL"}).json()["signalled"] is True


def test_signals_reach_the_job_and_sigkill_ends_its_tree(a: httpx.Client) -> None:
    pid = _start(a, "sig", "trap 'echo got-term; exit 7' TERM; echo ready; while true; do sleep 0.05; done")
    _until(lambda: a.get(f"{A}/sig/processes/{pid}").json()["stdout"] == "ready\n" or None)
    assert a.post(f"{A}/sig/processes/{pid}/signal", json={"signal": "SIGTERM"}).json()["signalled"] is True
    out, _, end = _read_all(a, "sig", pid)
    assert "got-term" in out and (end["status"], end["exit_code"]) == ("exited", 7)
    assert a.post(f"{A}/sig/processes/{pid}/signal", json={"signal": "SIGTERM"}).json() == {
        "pid": pid, "signal": "SIGTERM", "signalled": False, "running": False}
    pid = _start(a, "sig", "sleep 1000 & echo $! > child.pid; wait")
    _until(lambda: a.post("/v1/sandbox/bash", json={"session_id": "sig", "command": "cat child.pid"}).json()["stdout"])
    r = a.post(f"{A}/sig/processes/{pid}/signal", json={"signal": "sigkill"})
    assert r.status_code == 200 and r.json()["signal"] == "SIGKILL", r.text
    _, _, end = _read_all(a, "sig", pid)
    assert (end["status"], end["signal"], end["exit_code"]) == ("signalled", 9, -9)
    alive = a.post("/v1/sandbox/bash", json={"session_id": "sig", "command": "kill -0 $(cat child.pid) && echo alive"})
    assert alive.json()["stdout"] == "", "the job's child survived SIGKILL"
    r = a.post(f"{A}/sig/processes/{pid}/signal", json={"signal": "SIGSEGV"})
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "signal"
    r = a.post(f"{A}/sig/processes/424242/signal", json={"signal": "SIGTERM"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "SB002"
    assert a.get(f"{A}/sig/processes/424242").status_code == 404


def test_refusals_say_what_happened(a: httpx.Client) -> None:
    """Review 31, F7: a write after closing stdin said "started without stdin"; a second SIGKILL said
    ``signalled: true``; an unknown session's 404 blamed a header the request never sent."""
    pid = _start(a, "msg", "cat > /dev/null; sleep 30", stdin=True)
    assert a.post(f"{A}/msg/processes/{pid}/stdin", json={"close": True}).json()["stdin"] is False
    r = a.post(f"{A}/msg/processes/{pid}/stdin", json={"data": "late\n"})
    assert r.status_code == 409 and r.json()["error"]["message"] == f"process {pid} has its stdin closed", r.text
    r = a.post(f"{A}/msg/processes/{pid}/signal", json={"signal": "SIGKILL"})
    assert r.status_code == 200 and r.json() == {"pid": pid, "signal": "SIGKILL", "signalled": True,
                                                 "running": False}, r.text  # the answer waits for the end
    for sig in ("SIGKILL", "SIGTERM"):
        r = a.post(f"{A}/msg/processes/{pid}/signal", json={"signal": sig})
        assert r.status_code == 200 and r.json() == {"pid": pid, "signal": sig, "signalled": False,
                                                     "running": False}, r.text
    r = a.post(f"{A}/msg/processes/{pid}/stdin", json={"data": "x"})
    assert r.status_code == 409 and r.json()["error"]["message"] == f"process {pid} has ended", r.text
    no_stdin = _start(a, "msg", "sleep 30")
    r = a.post(f"{A}/msg/processes/{no_stdin}/stdin", json={"data": "x"})
    assert r.status_code == 409 and "was started without stdin" in r.json()["error"]["message"], r.text
    a.post(f"{A}/msg/processes/{no_stdin}/signal", json={"signal": "SIGKILL"})
    for method, suffix in (("GET", ""), ("GET", "/1"), ("POST", "/1/signal")):
        r = a.request(method, f"{A}/never-made/processes{suffix}", json={} if method == "POST" else None)
        err = r.json()["error"]
        assert r.status_code == 404 and err["details"]["reason"] == "not_created", (suffix, r.text)
        assert "X-Execbox-Create-Session" not in err["message"]
        assert "only starting a process creates a session" in err["message"]
        r = a.request(method, f"{A}/never-made/processes{suffix}", json={} if method == "POST" else None,
                      headers={"X-Execbox-Create-Session": "false"})
        said = "the request said X-Execbox-Create-Session: false"
        assert r.status_code == 404 and said in r.json()["error"]["message"], (suffix, r.text)


def test_a_process_starts_in_the_deepest_non_ascii_cwd_a_run_may_use(a: httpx.Client) -> None:
    # the cwd travels to the agent in the start's meta (kept for a later service to adopt the
    # process); 1,500 non-ASCII characters were once refused as "meta is over 8192 bytes"
    deep = "/".join(["é" * 100] * 15)
    r = a.post("/v1/sandbox/execute", json={"session_id": "deepcwd", "language": "bash",
                                            "code": f"mkdir -p '{deep}' && echo made"})
    assert r.status_code == 200 and r.json()["stdout"] == "made\n", r.text
    pid = _start(a, "deepcwd", "pwd", cwd=deep)
    out, _, info = _read_all(a, "deepcwd", pid)
    assert out.rstrip("\n").endswith(deep) and info["cwd"] == deep, (out[-200:], info)


def test_a_process_past_its_timeout_is_killed_with_its_job(a: httpx.Client) -> None:
    pid = _start(a, "to", "sleep 1000 & echo $! > bg.pid; echo started; while true; do sleep 0.05; done", timeout=1.5)
    out, _, end = _read_all(a, "to", pid)
    assert out == "started\n"
    assert (end["status"], end["timed_out"], end["signal"]) == ("timed_out", True, 9)
    assert end["ended_at"] - end["started_at"] < 15
    alive = a.post("/v1/sandbox/bash", json={"session_id": "to", "command": "kill -0 $(cat bg.pid) && echo alive"})
    assert alive.json()["stdout"] == "", "the timed-out job's child survived"
    r = a.post(f"{A}/to/processes", json={"command": "true", "timeout": 4000})  # the jail's max_timeout: 3600
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "timeout", r.text


def test_bad_starts_name_the_field(a: httpx.Client) -> None:
    for body, field in (({"command": " "}, "command"), ({"command": "true", "cwd": "../x"}, "cwd"),
                        ({"command": "true", "timeout": -1}, "timeout"), ({"command": "true", "bogus": 1}, "bogus"),
                        ({"command": "true", "cwd": "missing-dir"}, "cwd")):
        r = a.post(f"{A}/bad/processes", json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "SB002", (body, r.text)
        assert r.json()["error"]["details"]["field"] == field, (body, r.text)


def test_processes_are_confined_to_their_tenant_and_session(service: Service) -> None:
    a, b = service.a, service.b
    pid = _start(a, "mine", "sleep 30")
    for method, suffix, body in (("GET", "", None), ("GET", f"/{pid}", None), ("POST", f"/{pid}/signal", {}),
                                 ("POST", f"/{pid}/stdin", {"close": True}), ("POST", "", {"command": "true"})):
        r = b.request(method, f"{A}/mine/processes{suffix}", json=body)
        assert r.status_code == 403, (method, suffix, r.text)
    # tenant-b's own session of the same name is another session: the pid is not there
    b.post("/v1/sandbox/bash", json={"session_id": "mine", "command": "true"})
    r = b.get(f"/v1/sandbox/sessions/tenant-b/mine/processes/{pid}")
    assert r.status_code == 404, r.text
    assert b.get("/v1/sandbox/sessions/tenant-b/mine/processes").json()["processes"] == []
    assert a.post(f"{A}/mine/processes/{pid}/signal", json={"signal": "SIGKILL"}).json()["signalled"] is True
    # reads never create a session; the bare path serves the same routes
    r = a.get(f"{A}/never-used/processes")
    assert r.status_code == 404 and r.json()["error"]["details"]["reason"] == "not_created"
    assert a.get(f"/sessions/tenant-a/mine/processes/{pid}").status_code == 200


def test_a_process_and_its_requests_are_audited(service: Service) -> None:
    a = service.a
    pid = _start(a, "aud", "exit 3")
    _read_all(a, "aud", pid)
    pid2 = _start(a, "aud", "sleep 30")
    a.post(f"{A}/aud/processes/{pid2}/signal", json={"signal": "SIGKILL"})

    def rows() -> list[dict[str, Any]]:
        return [r for r in service.store.audit.list(tenant_id="tenant-a") if r["session_id"] == "aud"]

    got = _until(lambda: (r := rows()) and len([x for x in r if x["operation"] == "background_command"]) == 2 and r,
                 what="audit rows")
    bg = {x["exit_code"]: x for x in got if x["operation"] == "background_command"}
    assert bg[3]["status"] == "failed" and bg[-9]["status"] == "cancelled"
    assert any(x["operation"] == "process_signal" and x["status"] == "success" for x in got)


# -- the remote SDKs ---------------------------------------------------------------------------------

TICKER = "echo start; for i in $(seq 1 600); do echo $i >> tick.txt; sleep 0.05; done; echo never"


def test_remote_sandbox_background_command_is_a_process_beside_other_calls(service: Service) -> None:
    with RemoteSandbox.create(service.url, service.tenant_a) as sb:
        seen: list[tuple[str, str]] = []
        h = sb.commands.run(TICKER, background=True, on_output=lambda s, t: seen.append((s, t)))
        assert isinstance(h, ProcessHandle) and h.pid > 0
        _until(lambda: "start" in h.stdout)
        assert h.running and h.exit_code is None
        started = time.monotonic()
        assert sb.run_code("print(1 + 1)").stdout == "2\n"  # not queued behind the command
        assert sb.commands.run("echo fg").stdout == "fg\n"
        assert time.monotonic() - started < 10 and h.running
        with pytest.raises(ExecutionTimeoutError):
            h.wait(timeout=0.05)
        res = h.kill()
        assert res.metadata["killed"] is True and res.exit_code == -9 and "never" not in res.stdout
        assert h.exit_code == -9 and not h.running and ("stdout", "start\n") in seen
        ticks = sb.files.read("tick.txt").content
        time.sleep(0.5)
        assert sb.files.read("tick.txt").content == ticks, "the killed loop is still writing"
        h = sb.commands.run("read x; echo got-$x; echo bye >&2; exit 4", background=True, stdin=True)
        h.send_stdin("ping\n")
        res = h.wait(timeout=30)
        assert (res.stdout, res.stderr, res.exit_code, h.exit_code) == ("got-ping\n", "bye\n", 4, 4)
        h = sb.commands.run("sleep 30", background=True, timeout=1)
        res = h.wait(timeout=30)
        assert res.timed_out and res.error_code == "SB005" and res.exit_code == -9


def test_a_background_commands_handle_keeps_at_most_the_output_cap(service: Service) -> None:
    """Review 31, F2: the handle kept all a process wrote (1 GiB of client memory for ``yes``)."""
    with RemoteSandbox.create(service.url, service.tenant_a) as sb:
        seen = [0]
        h = sb.commands.run("yes abcdefghi | head -c 3000000; echo done >&2", background=True,
                            on_output=lambda s, t: seen.__setitem__(0, seen[0] + len(t)) if s == "stdout" else None)
        res = h.wait(timeout=60)
        assert seen[0] == 3_000_000  # every chunk reached the callback
        assert len(res.stdout) == process_handles.KEPT_OUTPUT == 1024 * 1024 and res.stdout.startswith("abcdefghi\n")
        assert res.truncated and h.truncated and res.stderr == "done\n" and res.exit_code == 0


def test_async_remote_sandbox_background_command(service: Service) -> None:
    async def go() -> None:
        async with await AsyncRemoteSandbox.create(service.url, service.tenant_a) as sb:
            h = await sb.commands.run(TICKER, background=True)
            assert isinstance(h, AsyncProcessHandle)
            for _ in range(300):
                if "start" in h.stdout:
                    break
                await asyncio.sleep(0.05)
            assert h.running and h.exit_code is None
            assert (await sb.run_code("print(3)")).stdout == "3\n"
            with pytest.raises(ExecutionTimeoutError):
                await h.wait(timeout=0.05)
            res = await h.kill()
            assert res.metadata["killed"] is True and "never" not in res.stdout and h.exit_code == -9
            h = await sb.commands.run("cat", background=True, stdin=True)
            await h.send_stdin(b"raw\n")
            await h.close_stdin()
            res = await h.wait(timeout=30)
            assert (res.stdout, res.exit_code) == ("raw\n", 0)

    with ThreadPoolExecutor(1) as pool:  # a fresh thread: another suite may own this thread's loop
        pool.submit(asyncio.run, go()).result()


def test_closing_a_session_ends_its_processes_and_the_service_forgets_them(service: Service) -> None:
    a = service.a
    pid = _start(a, "gone", "yes | head -c 100000; sleep 100")
    _until(lambda: a.get(f"{A}/gone/processes/{pid}", params={"wait": 5, "stdout_offset": 0}).json()["stdout"])
    assert a.post(f"{A}/gone/close").status_code == 200
    table = service.app.state.services.processes
    _until(lambda: ("tenant-a", "gone") not in table._procs, what="the closed session's processes forgotten")
    r = a.get(f"{A}/gone/processes/{pid}")
    assert r.status_code == 404 and r.json()["error"]["details"]["reason"] == "not_created"
