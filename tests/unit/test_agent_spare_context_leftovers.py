"""A one-shot run in a spare context (Docker's warm start: ``script`` with a ``context_id``) leaves
nothing running once it is answered: the spare and what the run started end before the reply.

The host ends a used spare with ``context.reset`` from another thread after the reply, so a
child the run left behind kept writing while the caller already read its files (the conformance
case background_ends_with_run failed this way on docker-runsc, where the first stateless Python
run of a pooled box goes to such a spare). A real agent process on pipes."""

from __future__ import annotations

import time
from pathlib import Path

from .test_agent_request_order import RawAgent, agent  # noqa: F401 - the raw agent fixture

LEAVE_CHILD = ("import subprocess, sys, time\n"
               "p = subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True:\\n"
               "    open(\"bg.txt\", \"a\").write(\".\")\\n    time.sleep(0.02)'])\n"
               "open('child.pid', 'w').write(str(p.pid))\n"
               "time.sleep(0.3)\nprint('started')\n")


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_a_spare_contexts_run_leaves_nothing_running_at_its_reply(agent: RawAgent, tmp_path: Path) -> None:  # noqa: F811
    ws = tmp_path / "ws"
    agent.send_together({"id": 1, "op": "exec", "language": "python", "code": "", "context_id": "warm1",
                         "timeout": 20})
    assert agent.reply(1, timeout=30)["ok"]
    started = time.monotonic()
    agent.send_together({"id": 2, "op": "exec", "language": "python", "code": LEAVE_CHILD,
                         "context_id": "warm1", "script": True, "timeout": 20})
    reply = agent.reply(2, timeout=30)
    took = time.monotonic() - started
    assert reply["ok"] and reply["value"]["stdout"] == "started\n", reply
    child = int((ws / "child.pid").read_text())
    assert not _running(child)  # dead at the reply, not after the host's later context.reset
    size = (ws / "bg.txt").stat().st_size
    time.sleep(0.2)
    assert (ws / "bg.txt").stat().st_size == size
    assert took < 0.3 + 0.15 + 1.0  # the leftover's open stdout did not hold the reply for the drain grace
    agent.send_together({"id": 4, "op": "context.reset", "context_id": "warm1"})  # the host's later reset
    assert agent.reply(4, timeout=10)["ok"]
    agent.send_together({"id": 5, "op": "exec", "language": "python", "code": "print(1)", "timeout": 20})
    assert agent.reply(5, timeout=30)["value"]["stdout"] == "1\n"
