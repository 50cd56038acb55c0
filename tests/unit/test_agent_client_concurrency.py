"""Many host threads on one box at once, through the real host client and a real agent: runs,
file operations and background processes, each checked for its own answer.

The host client sends runs and file operations one at a time and background-process ops beside
them, and sorts the replies by id (boxes/agent_client.py); the agent serves those ops even in the
middle of a run (agent/main.py, agent/children.py). Replies going to the wrong caller, a caller
left waiting for a reply that was read by another, or an op parked behind a run all show up here
as a wrong value or a thread that does not finish.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from execbox.boxes.agent_client import AgentClient, PipeTransport

ROUNDS = 12


@pytest.fixture
def client(tmp_path: Path):
    proc = subprocess.Popen([sys.executable, "-m", "execbox.agent", "--workspace", str(tmp_path / "ws"),
                             "--preload", "none"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.stdin is not None and proc.stdout is not None
    c = AgentClient(PipeTransport(proc.stdin.fileno(), proc.stdout.fileno(), owns_fds=False), "stress")
    c.wait_ready(30)
    yield c
    proc.kill()
    proc.wait(timeout=10)


def _runs(c: AgentClient, n: int) -> None:
    for i in range(ROUNDS):
        code = f"import time\ntime.sleep(0.01 * ({i} % 3))\nprint({n} * 100 + {i})"
        v = c.call("exec", {"language": "python", "code": code, "timeout": 30}, timeout=60)
        assert v["stdout"] == f"{n * 100 + i}\n", v


def _files(c: AgentClient, n: int) -> None:
    for i in range(ROUNDS):
        body = f"thread {n} round {i} ".encode() * (1 + i * 50)
        c.call("files.write", {"path": f"t{n}.bin", "content_b64": base64.b64encode(body).decode()}, timeout=60)
        got = c.call("files.read_bytes", {"path": f"t{n}.bin"}, timeout=60)
        assert base64.b64decode(got["content_b64"]) == body


def _background(c: AgentClient, n: int) -> None:
    for i in range(ROUNDS // 2):
        pid = c.call("proc.start", {"command": f"echo bg-{n}-{i}; echo err-{n}-{i} >&2", "env": {}, "stdin": False},
                     timeout=30)["pid"]
        out = err = b""
        end = time.monotonic() + 30
        while True:
            v = c.call("proc.poll", {"pid": pid, "stdout_offset": len(out), "stderr_offset": len(err)}, timeout=30)
            out += base64.b64decode(v["stdout_b64"])
            err += base64.b64decode(v["stderr_b64"])
            if v["exited"]:
                break
            assert time.monotonic() < end, "a background process never reported its exit"
            time.sleep(0.005)
        assert (out, err, v["exit_code"]) == (f"bg-{n}-{i}\n".encode(), f"err-{n}-{i}\n".encode(), 0)


def test_threads_sharing_one_box_each_get_their_own_answers(client: AgentClient) -> None:
    errors: list[BaseException] = []

    def guarded(fn, n: int) -> None:
        try:
            fn(client, n)
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    workers = [threading.Thread(target=guarded, args=(fn, n), daemon=True)
               for n, fn in enumerate([_runs, _runs, _files, _files, _background, _background, _background])]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert not [w for w in workers if w.is_alive()], "a caller is still waiting for its reply"
    assert not errors, errors
    assert client.call("ping", timeout=10)["pong"] is True


@pytest.mark.parametrize("agent_serves_files_beside_runs", [True, False])
def test_a_file_write_during_a_run_waits_only_for_an_agent_that_cannot_serve_it(
        client: AgentClient, tmp_path: Path, agent_serves_files_beside_runs: bool) -> None:
    if not agent_serves_files_beside_runs:
        client.beside_run = frozenset()  # as for an agent that did not offer it (older, or re-attached)
    started, release = tmp_path / "started", tmp_path / "release"
    code = (f"import os, time\nopen({str(started)!r}, 'w').close()\n"
            f"while not os.path.exists({str(release)!r}):\n    time.sleep(0.02)\nprint('ran')")
    run: dict = {}
    runner = threading.Thread(target=lambda: run.update(client.call(
        "exec", {"language": "python", "code": code, "timeout": 60}, timeout=90)), daemon=True)
    runner.start()
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert started.exists(), "the run did not start"  # under way: the write is sent after it
    wrote = threading.Event()
    writer = threading.Thread(target=lambda: (client.call("files.write", {"path": "w.txt", "content": "x"},
                                                          timeout=90), wrote.set()), daemon=True)
    writer.start()
    # served beside the run: at once (30 s is for a loaded machine); held: still waiting after 1.5 s
    assert wrote.wait(30 if agent_serves_files_beside_runs else 1.5) is agent_serves_files_beside_runs
    assert runner.is_alive()
    release.touch()
    runner.join(30)
    writer.join(30)
    assert run["stdout"] == "ran\n" and wrote.is_set()
    assert (tmp_path / "ws" / "w.txt").read_text() == "x"
