"""Bench: what running the agent inside a cloud sandbox costs per request (providers/remote_agent.py).

The "cloud" is a local bubblewrap sandbox (home at /home/user, own /tmp), the same stand-in the
E2B/AgentRun fakes use, so only the in-sandbox cost is measured (a real cloud adds its network
round trips: one upload and one command per request). Side by side, in one process:

  - baseline: one command `python3 -c pass` in the sandbox (the least any command costs there),
  - a request to the installed agent (`print(1)`: upload the request file, run the one-shot agent),
  - a first request on a fresh sandbox (upload the ~50 KB bundle, install it to /tmp, run).

    .venv/bin/python bench/bench_remote_agent.py [-n 50]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.unit.remote.fake_e2b import HOME  # noqa: E402
from tests.unit.remote.test_remote_agent import LocalTransport  # noqa: E402

from _stats import measure, print_table  # noqa: E402
from execbox.providers.remote_agent import RemoteAgent, bundle  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=50)
    n = ap.parse_args().n
    root = Path(tempfile.mkdtemp(prefix="bench-remote-agent-"))
    counter = iter(range(10**9))

    def fresh() -> RemoteAgent:
        d = root / f"sb{next(counter)}"
        d.mkdir()
        return RemoteAgent(LocalTransport(d), HOME, "bench")

    warm = fresh()
    req = {"language": "python", "code": "print(1)", "arguments": None}

    def run_warm() -> None:
        r = warm.execute(req, 10.0, {}, None, False, lambda p: b"")
        assert r.stdout == "1\n", r

    def run_first() -> None:
        r = fresh().execute(req, 10.0, {}, None, False, lambda p: b"")
        assert r.stdout == "1\n", r

    def bare_command() -> None:
        out, _ = warm.transport.run(["python3", "-c", "pass"], 10.0, None)

    rows = [
        measure("baseline: `python3 -c pass` in the sandbox", bare_command, n=n),
        measure("request to the installed agent", run_warm, n=n,
                baseline="baseline: `python3 -c pass` in the sandbox"),
        measure("first request (upload + install)", run_first, n=max(5, n // 5), warmup=1,
                baseline="request to the installed agent"),
    ]
    print_table(f"remote agent per request (bundle {len(bundle()[1]) // 1024} KiB, load {os.getloadavg()[0]:.2f})",
                rows)


if __name__ == "__main__":
    main()
