"""A/B two source trees of execbox on the same machine: a jail session's run, interleaved.

    git worktree add /tmp/old <rev>
    .venv/bin/python bench/ab_trees.py /tmp/old/src src --rounds 3 -n 400

Each round runs one subprocess per tree (its ``src`` first on ``PYTHONPATH``), alternating, so
load drifts hit both alike; each subprocess starts a jail session box, warms it with 30 runs and
times ``-n`` runs (cells of one context with ``--context``). Prints p50, p95 and runs/s per round
and tree, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
from execbox.providers.jail import JailProvider
code, language, n, context = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] or None
p = JailProvider()
p.initialize({"pool_size": 0, "preload": "none"})
iid = p.create_instance(session_id="ab").instance_id
for _ in range(30):
    p.execute_code(iid, code, language, 10, None, context_id=context)
times = []
start = time.perf_counter()
for _ in range(n):
    t = time.perf_counter()
    p.execute_code(iid, code, language, 10, None, context_id=context)
    times.append((time.perf_counter() - t) * 1000)
wall = time.perf_counter() - start
p.shutdown()
times.sort()
print(json.dumps({"p50": times[len(times) // 2], "p95": times[int(len(times) * 0.95)], "rate": n / wall}))
"""


def run_tree(src: str, code: str, language: str, n: int, context: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
    out = subprocess.run([sys.executable, "-c", CHILD, code, language, str(n), context], env=env, check=True,
                         capture_output=True, text=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help="baseline tree's src directory")
    ap.add_argument("b", help="candidate tree's src directory")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=400)
    ap.add_argument("--code", default="print(1)")
    ap.add_argument("--language", default="python")
    ap.add_argument("--context", default="", help="run the code as cells of this context_id")
    args = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {args.a: [], args.b: []}
    print(f"{'round':>5}  {'tree':<40} {'p50 ms':>8} {'p95 ms':>8} {'runs/s':>8}")
    for i in range(1, args.rounds + 1):
        for tree in (args.a, args.b):
            r = run_tree(tree, args.code, args.language, args.n, args.context)
            results[tree].append(r)
            print(f"{i:>5}  {tree:<40} {r['p50']:>8.2f} {r['p95']:>8.2f} {r['rate']:>8.1f}")
    med = {t: statistics.median(r["p50"] for r in rs) for t, rs in results.items()}
    print(f"median p50: {args.a} {med[args.a]:.2f} ms, {args.b} {med[args.b]:.2f} ms, "
          f"ratio x{med[args.b] / med[args.a]:.2f} (candidate / baseline)")
    print(f"host: {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
