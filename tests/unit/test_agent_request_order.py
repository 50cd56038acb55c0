"""Requests the agent reads in one chunk: a background-process or file op that arrives together
with an ``exec`` is answered while the run goes on, and a cancel read with its run stops that run.

A real agent process on pipes; both frames go to it in one write, which is what a busy host does
when one thread sends a run and another polls a background process a moment later (CI saw an
E2B background command's output stall for the whole cell this way)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from execbox.agent import protocol

WAIT_FOR_FILE = "import os, time\nwhile not os.path.exists({path!r}):\n    time.sleep(0.02)\nprint('released')"


class RawAgent:
    def __init__(self, proc: subprocess.Popen) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc, self.w, self.r = proc, proc.stdin.fileno(), proc.stdout.fileno()
        self.frames = protocol.FrameBuffer()
        self.seen: list[dict] = []
        self.ready: dict = {}

    def send_together(self, *messages: dict) -> None:
        os.write(self.w, b"".join(protocol.encode_frame(m) for m in messages))

    def reply(self, rid: int, timeout: float) -> dict | None:
        """The reply to ``rid`` if it comes within ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while True:
            for msg in self.seen:
                if msg.get("id") == rid and "event" not in msg:
                    self.seen.remove(msg)
                    return msg
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                return None
            data = os.read(self.r, 1 << 20)
            assert data, "the agent exited"
            self.seen.extend(self.frames.feed(data))


@pytest.fixture
def agent(tmp_path: Path):
    proc = subprocess.Popen([sys.executable, "-m", "execbox.agent", "--workspace", str(tmp_path / "ws"),
                             "--preload", "none"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(tmp_path)})
    raw = RawAgent(proc)
    end = time.monotonic() + 30
    while not any(m.get("event") == "ready" for m in raw.seen):
        assert select.select([raw.r], [], [], max(0.0, end - time.monotonic()))[0], "agent not ready"
        raw.seen.extend(raw.frames.feed(os.read(raw.r, 1 << 20)))
    raw.ready = raw.seen.pop(0)
    raw.seen.clear()
    yield raw
    proc.kill()
    proc.wait(timeout=10)


def test_a_background_op_read_with_a_run_is_answered_while_the_run_goes_on(agent: RawAgent, tmp_path: Path) -> None:
    release = tmp_path / "release"
    code = WAIT_FOR_FILE.format(path=str(release))
    agent.send_together({"id": 1, "op": "exec", "language": "python", "code": code, "timeout": 60},
                        {"id": 2, "op": "proc.start", "command": "echo from-bg", "env": {}, "stdin": False})
    started = agent.reply(2, timeout=10)
    assert started is not None, "proc.start waited behind the run it was read with"
    assert started["ok"] and started["value"]["pid"] > 0
    agent.send_together({"id": 3, "op": "exec", "language": "python", "code": "print(0)", "timeout": 5})
    agent.send_together({"id": 4, "op": "ping"})  # a later inline op goes through the run's pump
    assert agent.reply(4, timeout=10) is not None
    assert agent.reply(1, timeout=0.2) is None  # the run is still waiting for its file
    release.touch()
    done = agent.reply(1, timeout=30)
    assert done is not None and done["value"]["stdout"] == "released\n"
    queued = agent.reply(3, timeout=30)  # the ordinary request behind it runs after it, in order
    assert queued is not None and queued["value"]["stdout"] == "0\n"


def test_a_cancel_read_with_its_run_stops_it(agent: RawAgent, tmp_path: Path) -> None:
    code = WAIT_FOR_FILE.format(path=str(tmp_path / "never"))
    agent.send_together({"id": 7, "op": "exec", "language": "python", "code": code, "timeout": 60},
                        {"op": "cancel", "target": 7})
    done = agent.reply(7, timeout=20)
    assert done is not None, "the cancel waited behind the run it was meant to stop"
    assert done["ok"] and done["value"]["cancelled"] is True
    agent.send_together({"op": "cancel", "target": 7}, {"id": 8, "op": "ping"})  # a late cancel: ignored
    assert agent.reply(8, timeout=10)["ok"]
    assert not [m for m in agent.seen if m.get("id") is None]  # and not answered with an error


def test_file_ops_are_served_beside_a_run_and_the_agent_says_so(agent: RawAgent) -> None:
    assert set(agent.ready["beside_run"]) == set(protocol.FILE_OPS)
    code = "import os, time\nwhile not os.path.exists('go.txt'):\n    time.sleep(0.02)\nprint(open('go.txt').read())"
    agent.send_together({"id": 1, "op": "exec", "language": "python", "code": code, "timeout": 60},
                        {"id": 2, "op": "files.write", "path": "note.txt", "content": "beside"})
    assert agent.reply(2, timeout=10)["ok"], "a file write read with a run waited for it"
    agent.send_together({"id": 3, "op": "files.read", "path": "note.txt"})  # during the run's pump
    assert agent.reply(3, timeout=10)["value"]["content"] == "beside"
    assert agent.reply(1, timeout=0.2) is None  # still waiting for go.txt
    agent.send_together({"id": 4, "op": "files.write", "path": "go.txt", "content": "released by a write"})
    assert agent.reply(4, timeout=10)["ok"]
    done = agent.reply(1, timeout=30)
    assert done is not None and done["value"]["stdout"] == "released by a write\n"
