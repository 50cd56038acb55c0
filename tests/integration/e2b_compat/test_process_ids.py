"""A process's pid names one process for its sandbox's life, through the official SDK against a
real `execbox serve` (jail) (review 38, F3).

Every box is a fresh pid namespace, so after a box death the new box's processes get the same
small pids as the dead box's. Before, a pid handed out in the dead box then named a new process,
maybe another client's: `commands.kill(old pid)` SIGKILLed it and `connect` / `send_stdin`
reached it. Now such a process gets an alias above the kernel's pid range, and the old pid
answers as envd does for a process it no longer runs (NOT_FOUND: `kill` is False, `connect`
raises NotFoundException).
"""

from __future__ import annotations

import time

import pytest

from execbox.service.bg_adopt import ALIAS_BASE

from .conftest import Server, kill_box

e2b = pytest.importorskip("e2b")


def _box_pid(sandbox, name: str) -> int:  # noqa: ANN001
    """The pid in the box that a process started by ``_start`` wrote to /home/user/``name`` (read
    as a file: a command would take a pid of the box itself)."""
    deadline = time.monotonic() + 15
    while True:
        try:
            text = sandbox.files.read(f"/home/user/{name}").strip()
        except e2b.NotFoundException:
            text = ""
        if text:
            return int(text)
        assert time.monotonic() < deadline, f"{name} was not written"
        time.sleep(0.05)


def _start(sandbox, name: str):  # noqa: ANN001, ANN202
    """A background process (stdin on) that writes its box pid to /home/user/``name``, then echoes
    the first line it reads and sleeps."""
    return sandbox.commands.run(f"echo $$ > /home/user/{name}; read line; echo got $line; exec sleep 1000",
                                background=True, stdin=True)


def _running(sandbox) -> set[int]:  # noqa: ANN001
    return {p.pid for p in sandbox.commands.list()}


def test_a_pid_of_a_dead_box_never_names_a_process_of_the_next_one(e2b_env: Server) -> None:
    sandbox = e2b.Sandbox.create(timeout=180)
    try:
        old = _start(sandbox, "pid-old")
        assert _box_pid(sandbox, "pid-old") == old.pid  # the box pid, while nothing collides
        kill_box(sandbox)
        with pytest.raises(e2b.CommandExitException):
            old.wait()

        other = e2b.Sandbox.connect(sandbox.sandbox_id)  # another client of the sandbox
        new = None
        for i in range(60):  # until a process of the new box gets the old one's box pid
            h = _start(other, f"pid-{i}")
            if _box_pid(other, f"pid-{i}") == old.pid:
                new = h
                break
            assert other.commands.kill(h.pid)
        assert new is not None, f"no process of the new box got pid {old.pid}"
        assert new.pid != old.pid and new.pid > ALIAS_BASE  # an alias: the old pid stays the old process's
        assert new.pid in _running(other) and old.pid not in _running(other)

        # the old pid answers as for a process that ended, never reaching the new one
        assert sandbox.commands.kill(old.pid) is False
        with pytest.raises(e2b.NotFoundException):
            sandbox.commands.connect(old.pid)
        with pytest.raises(e2b.NotFoundException):
            sandbox.commands.send_stdin(old.pid, "wrong\n")
        with pytest.raises(e2b.NotFoundException):
            sandbox.commands.close_stdin(old.pid)
        time.sleep(0.5)
        assert new.pid in _running(other)
        assert other.commands.run(f"kill -0 {old.pid} && echo alive").stdout.strip() == "alive"  # its box pid

        # its own pid works as any: connect, stdin, kill (from either client)
        follow = sandbox.commands.connect(new.pid)
        sandbox.commands.send_stdin(new.pid, "hello\n")
        deadline = time.monotonic() + 10  # it read the line: it execs sleep once it echoed it
        while other.commands.run(f"tr '\\0' ' ' < /proc/{old.pid}/cmdline").stdout.strip() != "sleep 1000":
            assert time.monotonic() < deadline, "the process did not read its stdin"
            time.sleep(0.1)
        assert other.commands.kill(new.pid) is True
        with pytest.raises(e2b.CommandExitException) as ended:
            follow.wait()
        assert "got hello" in ended.value.stdout
        assert new.pid not in _running(sandbox)
        assert sandbox.commands.kill(new.pid) is False  # ended: not found
    finally:
        sandbox.kill()
