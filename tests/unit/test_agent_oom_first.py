"""User code is the OOM killer's first pick, never the agent: a run, a Python context and a background
process all have oom_score_adj 1000 while the agent keeps its own.

The box's memory limit covers the agent too; user code that filled tmpfs and spread over small
processes used to get the agent (the biggest process) killed, ending the whole session box."""

from __future__ import annotations

import base64
import time

from .test_agent_request_order import RawAgent, agent  # noqa: F401 - the raw agent fixture

READ = "print(open('/proc/self/oom_score_adj').read().strip())"


def _own_score(pid: int) -> int:
    with open(f"/proc/{pid}/oom_score_adj") as f:
        return int(f.read())


def test_every_user_code_process_is_picked_before_the_agent(agent: RawAgent) -> None:  # noqa: F811
    agent.send_together({"id": 1, "op": "exec", "language": "python", "code": READ, "timeout": 30})
    assert agent.reply(1, timeout=30)["value"]["stdout"] == "1000\n"
    agent.send_together({"id": 2, "op": "exec", "language": "bash", "timeout": 30,
                         "code": "cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'"})
    assert agent.reply(2, timeout=30)["value"]["stdout"] == "1000\n1000\n"  # and what it starts
    agent.send_together({"id": 3, "op": "exec", "language": "python", "code": READ, "timeout": 30,
                         "context_id": "c1"})
    assert agent.reply(3, timeout=30)["value"]["stdout"] == "1000\n"
    agent.send_together({"id": 4, "op": "proc.start", "command": "cat /proc/self/oom_score_adj", "env": {},
                         "stdin": False})
    pid = agent.reply(4, timeout=10)["value"]["pid"]
    out = b""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        agent.send_together({"id": 5, "op": "proc.poll", "pid": pid, "stdout_offset": len(out)})
        polled = agent.reply(5, timeout=10)["value"]
        out += base64.b64decode(polled["stdout_b64"])
        if polled["exited"]:
            break
        time.sleep(0.05)
    assert out == b"1000\n"
    assert _own_score(agent.proc.pid) < 1000  # the agent itself is left as it started
