"""CPU of one agent lifecycle outside any jail, beside a bare interpreter start.

A lifecycle: start the staged agent with the box interpreter, wait for its ready frame, run
``print(1)``, ask it to shut down, wait for its exit: what every one-shot's box costs in the
agent itself (bwrap, cgroups and the service come on top: bench_scaling.py). Samples are CPU
milliseconds of the child (getrusage of reaped children), not wall time, so a busy machine
moves them little; the kinds are interleaved so that drift spreads evenly. ``--compare DIR``
adds another staged agent (a directory holding ``execbox_agent/``, e.g. one staged from an
older commit) as an A/B row. Prints tables only, asserts nothing.

    .venv/bin/python bench/bench_agent_start.py [-n 60] [--compare /var/lib/execbox/agent/<hash>]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _stats import Row, print_table  # noqa: E402
from execbox.agent import protocol  # noqa: E402
from execbox.boxes import runtime, staging  # noqa: E402
from execbox.boxes.box import AGENT_BOOT  # noqa: E402

PYTHON = runtime.SYSTEM_PYTHON
ENV = {"PATH": "/usr/bin:/bin", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def lifecycle(root: str, workspace: str, oneshot: bool) -> None:
    argv = [PYTHON, "-I", "-c", AGENT_BOOT, root, f"{runtime.AGENT_PACKAGE}.main", "--workspace", workspace,
            "--preload", "none", "--limits", '{"nofile": 1024}', *(["--oneshot"] if oneshot else [])]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=ENV, cwd=workspace)
    assert proc.stdin is not None and proc.stdout is not None
    frames = protocol.FrameBuffer()

    def until(pred) -> dict:  # noqa: ANN001
        while True:
            data = os.read(proc.stdout.fileno(), 1 << 16)
            if not data:
                raise RuntimeError("agent closed its output")
            for msg in frames.feed(data):
                if pred(msg):
                    return msg

    try:
        until(lambda m: m.get("event") == "ready")
        protocol.write_frame(proc.stdin.fileno(), {"id": 1, "op": "exec", "language": "python", "code": "print(1)",
                                                   "timeout": 10})
        reply = until(lambda m: m.get("id") == 1 and "ok" in m)
        if not reply["ok"] or reply["value"]["stdout"] != "1\n":
            raise RuntimeError(f"unexpected reply: {reply}")
        protocol.write_frame(proc.stdin.fileno(), {"id": 2, "op": "shutdown"})
        until(lambda m: m.get("id") == 2)
    finally:
        proc.stdin.close()
        proc.wait()
        proc.stdout.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=60, help="lifecycles per kind")
    ap.add_argument("--compare", default="", help="another staged agent directory (holding execbox_agent/)")
    args = ap.parse_args()
    staged = staging.staged_agent()
    with tempfile.TemporaryDirectory(prefix="execbox-bench-ws-") as ws:
        kinds = {
            "baseline: python3 -I -c pass": lambda: subprocess.run([PYTHON, "-I", "-c", "pass"], env=ENV, check=True),
            "agent lifecycle, --oneshot": lambda: lifecycle(staged, ws, True),
            "agent lifecycle, session box": lambda: lifecycle(staged, ws, False),
        }
        if args.compare:
            kinds[f"compare: {args.compare[-24:]}, --oneshot"] = lambda: lifecycle(args.compare, ws, True)
        cpu: dict[str, list[float]] = {k: [] for k in kinds}
        wall: dict[str, float] = dict.fromkeys(kinds, 0.0)
        for fn in kinds.values():  # warm the page cache and the staged bytecode
            fn()
        for _ in range(args.n):
            for name, fn in kinds.items():
                c, t = children_cpu(), time.perf_counter()
                fn()
                wall[name] += time.perf_counter() - t
                cpu[name].append((children_cpu() - c) * 1000)
    base = "baseline: python3 -I -c pass"
    rows = [Row(name, samples, wall[name], 1, None if name == base else base) for name, samples in cpu.items()]
    print_table("agent lifecycle outside a jail: CPU ms per lifecycle (p50/p95), lifecycles per wall second", rows)
    load = os.getloadavg()[0]
    print(f"host: {os.cpu_count()} cpus, load {load:.2f}; interpreter {PYTHON}; staged agent {staged}")


if __name__ == "__main__":
    main()
