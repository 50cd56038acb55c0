"""A box whose own processes fill its process limit: the agent's forks are refused (EAGAIN).

That is the box's doing, so each request that needs a process fails with SB008 (429) naming the
limit, the fds made for the child are not leaked, and the agent and its session go on; a run that
already has its child is not failed by the agent's own optional fork of the next spare (a
`docker-runc` fork-bomb run once answered "agent error: BlockingIOError" that way).

A real agent on pipes, as a uid of its own with RLIMIT_NPROC standing in for the box's pids limit
(root ignores RLIMIT_NPROC, so this needs root to change uid)."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import execbox
from tests.unit.test_agent_request_order import RawAgent

UID = 64987  # a uid no other test's processes use: RLIMIT_NPROC counts all of the uid's processes
NPROC = 12

FILL = """
import os, time
kids = globals().setdefault("kids", [])
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    kids.append(pid)
print(len(kids))
"""
END_SPARE = """
import os, signal, time
agent, me = os.getppid(), os.getpid()
for name in os.listdir("/proc"):  # the agent's other children: its spare (box code may kill it)
    if name.isdigit() and int(name) != me:
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == agent:
            os.kill(int(name), signal.SIGKILL)
time.sleep(0.3)  # the agent reaps it: its pid is free for FILL
"""
FREE = """
import os, signal
for k in kids:
    os.kill(k, signal.SIGKILL)
    os.waitpid(k, 0)
kids.clear()
print('freed')
"""


@pytest.fixture
def agent():
    if os.geteuid() != 0:
        pytest.skip("needs root: to run the agent as a uid of its own under RLIMIT_NPROC")
    home = Path(tempfile.mkdtemp(prefix="execbox-noroom-"))  # pytest's own tmp dirs are root's only
    ws = home / "ws"
    ws.mkdir()
    for path in (home, ws):
        os.chown(path, UID, UID)

    def as_box_user() -> None:
        os.setgroups([])
        os.setgid(UID)
        resource.setrlimit(resource.RLIMIT_NPROC, (NPROC, NPROC))
        os.setuid(UID)

    python = "/usr/bin/python3"  # as in a box: the service's own interpreter may sit where the uid cannot read
    if not os.access(python, os.X_OK):
        pytest.skip(f"needs {python} (the interpreter boxes run)")
    src = str(Path(execbox.__file__).parent.parent)
    proc = subprocess.Popen([python, "-I", "-c", f"import sys; sys.path.insert(0, {src!r}); "
                             "from execbox.agent.main import main; main(sys.argv[1:])",
                             "--workspace", str(ws), "--preload", "none"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env={"PATH": "/usr/bin:/bin", "TMPDIR": str(home)}, preexec_fn=as_box_user)  # noqa: PLW1509
    raw = RawAgent(proc)
    raw.send_together({"id": 0, "op": "ping"})
    assert raw.reply(0, timeout=30) is not None, "agent not ready"
    raw.seen.clear()
    yield raw
    proc.kill()
    proc.wait(timeout=10)
    subprocess.run(["pkill", "-KILL", "-U", str(UID)], check=False)
    shutil.rmtree(home, ignore_errors=True)


def ask(agent: RawAgent, rid: int, timeout: float = 30, **req) -> dict:
    agent.send_together({"id": rid, **req})
    reply = agent.reply(rid, timeout)
    assert reply is not None, f"no reply to {req}"
    return reply


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def assert_no_room(reply: dict, what: str) -> None:
    assert not reply["ok"], reply
    err = reply["error"]
    assert (err["code"], err["status"], err["details"]["reason"]) == ("SB008", 429, "box_process_limit"), err
    assert what in err["message"] and "pids_limit" in err["message"], err["message"]


def test_a_full_process_table_is_sb008_and_the_agent_recovers(agent: RawAgent) -> None:
    def run(rid: int, code: str, **kw) -> dict:
        return ask(agent, rid, op="exec", language="python", code=code, timeout=20, **kw)

    def fill(rid: int, end_spare: bool = False) -> None:
        time.sleep(0.3)  # children that just ended are reaped: their pids are free
        filled = run(rid, (END_SPARE if end_spare else "") + FILL, context_id="hog")
        assert filled["ok"] and int(filled["value"]["stdout"]) > 0, filled

    for rid in (1, 2):  # two plain runs first: from the second on the agent forks the next spare early
        assert run(rid, "print(1)")["value"]["stdout"] == "1\n"
    fill(3)

    # A run that takes the waiting spare runs, though the early fork of the next one is refused.
    done = run(4, "print('still runs')")
    assert done["ok"] and done["value"]["stdout"] == "still runs\n", done

    # Whatever else needs a process says why it cannot have one (with no spare waiting either).
    fill(5, end_spare=True)
    fds = open_fds(agent.proc.pid)
    assert_no_room(ask(agent, 6, op="proc.start", command="echo hi", env={}, stdin=False), "background process")
    assert_no_room(run(7, "print(2)", context_id="another"), "context")
    for rid, language in ((8, "javascript"), (9, "bash")):
        reply = ask(agent, rid, op="exec", language=language, code="1", timeout=20, context_id=f"c-{language}")
        assert_no_room(reply, "context")
    assert_no_room(run(10, "print(2)"), "the run's process")
    assert open_fds(agent.proc.pid) <= fds, "the pipes made for refused children leaked"

    # The box's code ends its processes: everything works again, in the same agent.
    assert run(11, FREE, context_id="hog")["value"]["stdout"] == "freed\n"
    started = ask(agent, 12, op="proc.start", command="echo from-bg", env={}, stdin=False)
    assert started["ok"] and started["value"]["pid"] > 0, started
    assert run(13, "print(3)", context_id="another")["value"]["stdout"] == "3\n"
    for rid, language, code in ((14, "javascript", "console.log(5)"), (15, "bash", "echo 5")):
        reply = ask(agent, rid, op="exec", language=language, code=code, timeout=20, context_id=f"c-{language}")
        assert reply["ok"] and reply["value"]["stdout"] == "5\n", reply
    assert run(16, "print(4)")["value"]["stdout"] == "4\n"
    assert agent.proc.poll() is None
