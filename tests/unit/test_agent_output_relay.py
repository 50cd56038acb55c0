"""Background output through the relay (agent/bg_output.py): a process's stdout/stderr are pipes
a relay child writes into segment files, so the box's file-size limit (RLIMIT_FSIZE) no longer
ends a long-running process after that much output in total; segments the host has read are
deleted; the end waits for the relay to write what the pipes held, and nothing is left behind."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from execbox.agent import bg_output
from tests.unit.test_agent_request_order import RawAgent


def test_the_relay_writes_segments_the_agent_reads_across(tmp_path: Path) -> None:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    ctl_r, ctl_w = os.pipe()
    out, err = str(tmp_path / "1.out"), str(tmp_path / "1.err")
    for prefix in (out, err):
        Path(bg_output.segment_path(prefix, 0)).touch()
    relay = threading.Thread(target=bg_output.relay, args=({out_r: out, err_r: err}, ctl_r, 10))
    relay.start()
    data = bytes(range(65, 100))  # 35 bytes: segments of 10, 10, 10, 5
    os.write(out_w, data[:17])
    os.write(out_w, data[17:])
    os.write(err_w, b"err")
    os.close(out_w)
    os.close(err_w)
    relay.join(5)
    assert not relay.is_alive()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1.err.0", "1.out.0", "1.out.1", "1.out.2", "1.out.3"]
    assert [os.path.getsize(f"{out}.{k}") for k in range(4)] == [10, 10, 10, 5]
    assert bg_output.read_from(out, 0, 100, 10) == (data[:10], True, 35)  # one segment per read
    assert bg_output.read_from(out, 27, 100, 10) == (data[27:30], True, 35)
    assert bg_output.read_from(out, 30, 100, 10) == (data[30:], False, 35)
    assert bg_output.read_from(err, 0, 100, 10) == (b"err", False, 3)
    assert bg_output.free_read(out, 0, 25, 10) == 20  # segments 0 and 1 deleted (no full page to punch)
    assert not os.path.exists(f"{out}.0") and not os.path.exists(f"{out}.1")
    assert bg_output.read_from(out, 25, 100, 10) == (data[25:30], True, 35)  # offsets still hold
    bg_output.remove(out)
    bg_output.remove(err)
    assert list(tmp_path.iterdir()) == []
    for fd in (out_r, err_r, ctl_r, ctl_w):
        os.close(fd)


def test_the_relay_ends_when_told_though_something_keeps_the_pipe_open(tmp_path: Path) -> None:
    out_r, out_w = os.pipe()
    ctl_r, ctl_w = os.pipe()
    prefix = str(tmp_path / "2.out")
    Path(bg_output.segment_path(prefix, 0)).touch()
    relay = threading.Thread(target=bg_output.relay, args=({out_r: prefix}, ctl_r))
    relay.start()
    os.write(out_w, b"written before the end")  # out_w stays open: a daemon the process left
    os.close(ctl_w)  # the process exited
    relay.join(bg_output.DRAIN_SECONDS + 2)
    assert not relay.is_alive()
    assert bg_output.read_from(prefix, 0, 100, bg_output.SEGMENT)[0] == b"written before the end"
    for fd in (out_r, out_w, ctl_r):
        os.close(fd)


@pytest.fixture
def small_agent(tmp_path: Path):
    """An agent whose children may write files of at most 1 MiB (the jail's limit is 512 MiB)."""
    proc = subprocess.Popen([sys.executable, "-m", "execbox.agent", "--workspace", str(tmp_path / "ws"),
                             "--preload", "none", "--limits", json.dumps({"fsize_bytes": 1 << 20})],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    raw = RawAgent(proc)
    deadline = time.monotonic() + 30
    while not any(m.get("event") == "ready" for m in raw.seen):
        assert time.monotonic() < deadline, "agent not ready"
        raw.seen.extend(raw.frames.feed(os.read(raw.r, 1 << 20)))
    raw.seen.clear()
    yield raw
    proc.kill()
    proc.wait(timeout=10)


class Calls:
    def __init__(self, agent: RawAgent) -> None:
        self.agent, self.rid = agent, 0

    def __call__(self, op: str, **req: object) -> dict:
        self.rid += 1
        self.agent.send_together({"id": self.rid, "op": op, **req})
        reply = self.agent.reply(self.rid, 30)
        assert reply is not None and reply["ok"], reply
        return reply["value"]


def _relay_of(agent_pid: int, pid: int) -> int:
    """The agent's child that reads the pipe process ``pid`` writes its stdout to."""
    pipe = os.readlink(f"/proc/{pid}/fd/1")
    assert pipe.startswith("pipe:"), pipe  # no longer a file of the process's own
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != pid:
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) != agent_pid:
                        continue
                if any(os.readlink(f"/proc/{name}/fd/{fd}") == pipe for fd in os.listdir(f"/proc/{name}/fd")):
                    return int(name)
            except (OSError, IndexError, ValueError):
                pass
    raise AssertionError("no relay")


def _gone(pid: int) -> bool:
    """Not a child anymore (exited and reaped by the agent)."""
    return not os.path.exists(f"/proc/{pid}")


def test_a_process_writes_more_than_the_file_size_limit_while_read(small_agent: RawAgent, tmp_path: Path) -> None:
    call = Calls(small_agent)
    cmd = ("sleep 0.5; head -c 3500000 /dev/zero | tr '\\0' o; head -c 1500000 /dev/zero | tr '\\0' e >&2; "
           "echo rc=$? >&2")
    pid = call("proc.start", command=cmd, env={}, stdin=False)["pid"]
    relay = _relay_of(small_agent.proc.pid, pid)
    out = err = 0
    tail = b""
    deadline = time.monotonic() + 60
    while True:
        v = call("proc.poll", pid=pid, stdout_offset=out, stderr_offset=err)
        so, se = base64.b64decode(v["stdout_b64"]), base64.b64decode(v["stderr_b64"])
        assert set(so) <= {ord("o")}
        out, err, tail = out + len(so), err + len(se), (tail + se)[-16:]
        if v["exited"]:
            break
        assert time.monotonic() < deadline
    assert (v["exit_code"], v["signal"]) == (0, None)  # not SIGXFSZ at 1 MiB, nor an EFBIG write
    assert out == 3_500_000 and err == 1_500_000 + len(b"rc=0\n") and tail.endswith(b"e" * 8 + b"rc=0\n")
    left = [p for p in tmp_path.rglob("*") if p.parent.name == "background"]
    assert left == []  # every segment deleted once read and the process forgotten
    assert _gone(relay)  # its relay is gone too


def test_a_killed_process_ends_at_once_with_its_relay(small_agent: RawAgent) -> None:
    call = Calls(small_agent)
    pid = call("proc.start", command="yes", env={}, stdin=False)["pid"]
    relay = _relay_of(small_agent.proc.pid, pid)
    assert call("proc.signal", pid=pid, signal="SIGKILL")["signalled"] is True
    deadline = time.monotonic() + 10
    while not call("proc.poll", pid=pid, stdout_offset=0, stderr_offset=0)["exited"]:
        assert time.monotonic() < deadline
    deadline = time.monotonic() + 10
    while not _gone(relay):  # the relay was killed with it and is reaped
        call("proc.list")
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _segment(tmp_path: Path, name: str) -> Path:
    found = [p for p in tmp_path.rglob(f"*.{name}.0") if p.parent.name == "background"]
    assert len(found) == 1, found
    return found[0]


def test_files_that_grow_after_the_relay_ended_are_read_no_further(small_agent: RawAgent, tmp_path: Path) -> None:
    """Box code (the same uid) appends to an ended process's segment: the stream's final size is
    what the relay wrote, and nothing past it is read or reported."""
    call = Calls(small_agent)
    pid = call("proc.start", command="head -c 300000 /dev/zero | tr '\\0' o", env={}, stdin=False)["pid"]
    deadline = time.monotonic() + 20
    while not (v := call("proc.poll", pid=pid, stdout_offset=0, stderr_offset=0))["ended"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert not v["exited"] and v["stdout_size"] == 300_000  # one poll returns at most 256 KiB
    with open(_segment(tmp_path, "out"), "ab") as f:
        f.write(b"F" * 1_000_000)
    with open(_segment(tmp_path, "err"), "ab") as f:
        f.write(b"F" * 1000)
    out = base64.b64decode(v["stdout_b64"])
    while True:
        v = call("proc.poll", pid=pid, stdout_offset=len(out), stderr_offset=0)
        assert v["stdout_size"] == 300_000 and v["stderr_size"] == 0
        assert base64.b64decode(v["stderr_b64"]) == b""
        out += base64.b64decode(v["stdout_b64"])
        if v["exited"]:
            break
        assert time.monotonic() < deadline
    assert out == b"o" * 300_000


def test_a_stopped_relay_is_killed_and_the_process_ends(small_agent: RawAgent) -> None:
    """User code stops the relay (SIGSTOP, the same uid): the process still ends, with what was read."""
    call = Calls(small_agent)
    pid = call("proc.start", command="echo l1; sleep 0.5", env={}, stdin=False)["pid"]
    relay = _relay_of(small_agent.proc.pid, pid)
    time.sleep(0.2)
    os.kill(relay, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while not (v := call("proc.poll", pid=pid, stdout_offset=0, stderr_offset=0))["exited"]:
        assert time.monotonic() < deadline, "the process never ends"
        time.sleep(0.05)
    assert v["exit_code"] == 0 and base64.b64decode(v["stdout_b64"]) == b"l1\n"
    deadline = time.monotonic() + 10
    while not _gone(relay):
        call("proc.list")
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_sigkill_ends_a_process_whose_relay_is_stopped(small_agent: RawAgent) -> None:
    call = Calls(small_agent)
    pid = call("proc.start", command="echo l1; sleep 0.3", env={}, stdin=False)["pid"]
    relay = _relay_of(small_agent.proc.pid, pid)
    os.kill(relay, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while not call("proc.poll", pid=pid, stdout_offset=0, stderr_offset=0)["ended"]:
        # the process exited; its relay (stopped) is still there
        if not any(p["pid"] == pid and p["running"] for p in call("proc.list")["processes"]):
            break
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert call("proc.signal", pid=pid, signal="SIGKILL")["signalled"] is True
    v = call("proc.poll", pid=pid, stdout_offset=0, stderr_offset=0)
    assert v["exited"]


def test_a_fifo_in_place_of_a_segment_does_not_block_the_agent(small_agent: RawAgent, tmp_path: Path) -> None:
    call = Calls(small_agent)
    pid = call("proc.start", command="echo hi; exec sleep 30", env={}, stdin=False)["pid"]
    seg = _segment(tmp_path, "out")
    seg.unlink()
    os.mkfifo(seg)
    started = time.monotonic()
    for off in (0, 2 << 20):  # a read, and a free of what was read (punching the current segment)
        v = call("proc.poll", pid=pid, stdout_offset=off, stderr_offset=0)
        assert not v["exited"] and v["stdout_b64"] == ""
    assert time.monotonic() - started < 5
    assert call("proc.signal", pid=pid, signal="SIGKILL")["signalled"] is True
