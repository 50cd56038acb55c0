"""The agent's spare draws a warm-up figure only in a box whose runs plot, only while the box is
idle, never into a run's output, and a run never waits for a spare still drawing.

A real agent process with a stand-in ``matplotlib.pyplot`` (the unit venv has no matplotlib)
whose warm-up figure writes noise to stdout and stderr and then takes ``WARM_S`` seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from execbox.boxes.agent_client import AgentClient, PipeTransport

LAUNCH = """
import os, sys, time, types
plt = types.ModuleType("matplotlib.pyplot")
plt.get_fignums = lambda: []
plt.close = lambda *a: None
sys.modules["matplotlib.pyplot"] = plt  # counts as preloaded: spares may warm figures
from execbox.agent import runners
def slow_figure():
    print("warm-up noise"); os.write(2, b"warm-up noise\\n")
    time.sleep(float(os.environ["WARM_S"]))
runners.warm_figures = slow_figure
from execbox.agent.main import main
main(sys.argv[1:])
"""

PLOTS = "# plt.plot(xs) would draw here\nprint(2)"


@pytest.fixture
def agent(tmp_path):
    started: list[tuple[subprocess.Popen, AgentClient]] = []

    def start(warm_s: float) -> tuple[subprocess.Popen, AgentClient]:
        env = {**os.environ, "WARM_S": str(warm_s), "TMPDIR": str(tmp_path)}
        proc = subprocess.Popen([sys.executable, "-c", LAUNCH, "--workspace", str(tmp_path / "ws"),
                                 "--preload", "none"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=env)
        assert proc.stdin is not None and proc.stdout is not None
        client = AgentClient(PipeTransport(proc.stdin.fileno(), proc.stdout.fileno(), owns_fds=False), "t")
        client.wait_ready(30)
        started.append((proc, client))
        return proc, client

    yield start
    for proc, client in started:
        try:
            client.call("shutdown", timeout=10)
        except Exception:  # noqa: BLE001 - already gone
            pass
        proc.wait(timeout=10)


def run(client: AgentClient, code: str) -> dict:
    return client.call("exec", {"language": "python", "code": code, "timeout": 20}, timeout=30)


def spare_state(client: AgentClient, want: str | None, timeout: float = 10.0) -> str | None:
    end = time.monotonic() + timeout
    while True:
        time.sleep(0.2)  # a ping is a request: the box must stay idle past FIGURE_IDLE in between
        state = client.call("ping")["spare_figures"]
        if state == want or time.monotonic() > end:
            return state


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
        return [int(p) for p in f.read().split()]


def test_a_box_that_never_plotted_keeps_a_plain_spare(agent):
    _, client = agent(0)
    assert run(client, "print(1)")["stdout"] == "1\n"
    assert spare_state(client, "warm", timeout=1.0) is None


def test_the_idle_spare_of_a_plotting_box_draws_and_its_noise_reaches_no_run(agent):
    _, client = agent(0)
    assert run(client, PLOTS)["stdout"] == "2\n"
    assert spare_state(client, "warm") == "warm"
    r = run(client, "print(3)")
    assert (r["exit_code"], r["stdout"], r["stderr"]) == (0, "3\n", "")


def test_a_run_arriving_while_the_spare_draws_gets_a_fresh_child_at_once(agent):
    proc, client = agent(600)  # a spare that started drawing would never be ready in time
    assert run(client, PLOTS)["stdout"] == "2\n"
    assert spare_state(client, "warming") == "warming"
    (drawing,) = children(proc.pid)
    r = run(client, "print(3)")  # exec timeout 20 s: waiting for that spare would fail it
    assert (r["exit_code"], r["stdout"], r["stderr"]) == (0, "3\n", "")
    end = time.monotonic() + 10
    while os.path.exists(f"/proc/{drawing}") and time.monotonic() < end:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{drawing}"), "the spare still drawing was killed and reaped"
    assert spare_state(client, "warming") == "warming"  # the next idle spare draws again
