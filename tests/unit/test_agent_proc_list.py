"""``proc.list`` tells a host that did not start a background process what it needs to follow it
(agent/bg_record.py): the ``meta`` object given to ``proc.start``, verbatim and bounded; whether
its stdin takes input now; and the first offset of each stream a poll still returns once the
agent has freed output an earlier host read. A real agent on pipes."""

from __future__ import annotations

import base64
import itertools
import time

from execbox.agent.background import PUNCH_EVERY
from execbox.agent.bg_record import META_MAX
from tests.unit.test_agent_request_order import RawAgent, agent  # noqa: F401 - the fixture

_ids = itertools.count(100)


def call(agent: RawAgent, op: str, **params) -> dict:  # noqa: F811
    rid = next(_ids)
    agent.send_together({"id": rid, "op": op, **params})
    reply = agent.reply(rid, timeout=30)
    assert reply is not None, f"no reply to {op}"
    return reply


def ok(agent: RawAgent, op: str, **params) -> dict:  # noqa: F811
    reply = call(agent, op, **params)
    assert reply["ok"], reply
    return reply["value"]


def entry(agent: RawAgent, pid: int) -> dict:  # noqa: F811
    (found,) = [p for p in ok(agent, "proc.list")["processes"] if p["pid"] == pid]
    return found


def test_proc_list_returns_the_meta_stdin_and_first_held_offsets(agent: RawAgent) -> None:  # noqa: F811
    meta = {"api": "http", "tenant": "t1", "session": "s1", "cwd": "sub dir/ü", "stdin": True,
            "timeout": 30.5, "nested": {"k": [1, None, "x"]}}
    reader = ok(agent, "proc.start", command="cat", env={}, stdin=True, meta=meta)["pid"]
    chatty = ok(agent, "proc.start", env={}, stdin=False,
                command="head -c 3000000 /dev/zero | tr '\\0' a; echo; sleep 60")["pid"]
    plain = ok(agent, "proc.start", command="sleep 60", env={}, stdin=False)["pid"]  # no meta (the E2B facade's)

    got = entry(agent, reader)
    assert got["meta"] == meta  # verbatim
    assert got["command"] == "cat" and got["running"] is True and got["stdin"] is True and got["pty"] is False
    assert (got["stdout_from"], got["stderr_from"]) == (0, 0)
    assert abs(got["started"] - time.time()) < 10
    assert "meta" not in entry(agent, plain) and entry(agent, plain)["stdin"] is False

    ok(agent, "proc.input", pid=reader, data_b64=base64.b64encode(b"hi\n").decode())
    ok(agent, "proc.close_stdin", pid=reader)
    assert entry(agent, reader)["stdin"] is False  # closed since it started: a new host sees that

    # an earlier host read 2 MiB + 5 bytes of the chatty one: the agent frees what lies before
    # (page-aligned), and a new host is told where the stream is still held
    read = 2 * 1024 * 1024 + 5
    taken = 0
    deadline = time.monotonic() + 30
    while taken < read:
        assert time.monotonic() < deadline, "no output"
        v = ok(agent, "proc.poll", pid=chatty, stdout_offset=taken, stderr_offset=0)
        taken += len(base64.b64decode(v["stdout_b64"]))
    ok(agent, "proc.poll", pid=chatty, stdout_offset=read, stderr_offset=0)
    got = entry(agent, chatty)
    # freed in steps of PUNCH_EVERY from wherever the earlier polls reached (their sizes depend
    # on how much output was there each time), page-aligned, never past what was read
    first = got["stdout_from"]
    assert read - PUNCH_EVERY < first <= read and first % 4096 == 0 and got["stderr_from"] == 0, got
    v = ok(agent, "proc.poll", pid=chatty, stdout_offset=got["stdout_from"], stderr_offset=0)
    assert base64.b64decode(v["stdout_b64"])[:16] == b"a" * 16  # the first held byte is really there
    for pid in (reader, chatty, plain):
        ok(agent, "proc.signal", pid=pid, signal="SIGKILL")


def test_proc_start_refuses_meta_that_is_not_a_bounded_object(agent: RawAgent) -> None:  # noqa: F811
    for bad in (["list"], "text", {"big": "x" * META_MAX}):
        reply = call(agent, "proc.start", command="true", env={}, stdin=False, meta=bad)
        assert not reply["ok"] and reply["error"]["details"]["field"] == "meta", reply
    assert ok(agent, "proc.list")["processes"] == []  # nothing was started
