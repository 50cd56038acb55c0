"""`make bench`: run every bench script within a time budget, then print each issue target beside the
figure measured for it, marking misses. Figures are read back from the scripts' own tables, so a
script's output stays the single source; a target whose row is missing is shown as "not measured".

    .venv/bin/python bench/run_all.py [--budget 840]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROW = re.compile(r"^(?P<name>\S.*?)\s+(?P<conc>\d+)\s+(?P<n>\d+)\s+(?P<p50>[\d.]+)\s+(?P<p95>[\d.]+)"
                 r"\s+(?P<ops>[\d.]+)\s+(?P<err>\d+)\b")
FIGURE = re.compile(r"^figure: (?P<name>.+): (?P<value>[\d.]+)$")
MEM = re.compile(r"^(?P<name>runtime .+?)\s+(?P<rss>[\d.]+)\s+(?P<pss>[\d.]+)\s+(?P<cg>[\d.]+)$")

# (script, arguments, share of the budget)
SCRIPTS = [
    ("bench_jail.py", ["-n", "100"], 0.15),
    ("bench_scaling.py", ["--n", "100", "--oneshot-n", "60"], 0.2),
    ("bench_http.py", [], 0.15),
    ("bench_docker.py", ["--n", "30", "--oneshot-n", "8"], 0.2),
    ("bench_docker.py", ["--n", "30", "--oneshot-n", "8", "--preload", "none"], 0.15),
    ("peers/bench_peers.py", ["--n", "30", "--oneshot-n", "6"], 0.2),
    ("bench_local.py", ["-n", "100"], 0.05),
]

# (target label, figure key, kind, threshold); kind "max" = figure <= threshold, "min" = figure >= threshold;
# "max-variant": the same target under another setting, printed for comparison and not counted as a miss
TARGETS = [
    ("sustained one-shot c=4 (runs/s)", "fig:jail sustained one-shot c=4 runs/s", "min", 60.0),
    ("sustained one-shot c=16 (runs/s)", "fig:jail sustained one-shot c=16 runs/s", "min", 60.0),
    ("jail one-shot from warm pool p50 (ms)", "p50:jail one-shot print(1), warm pool@1", "max", 6.0),
    ("jail session run p50 (ms)", "p50:jail session print(1)@1", "max", 3.0),
    ("HTTP session run p50 (ms)", "p50:http session execute c=1@1", "max", 6.0),
    ("runsc session run p50 (ms)", "p50:runsc: session execute, fork per run@1", "max", 30.0),
    ("runsc one-shot from pool p50 (ms)", "p50:runsc: one-shot from warm pool@1", "max", 20.0),
    ("runc pool refill per box p50 (ms)", "p50:runc: cold start (pool refill)@1", "max", 400.0),
    ("runsc pool refill per box p50 (ms)", "p50:runsc: cold start (pool refill)@1", "max", 1000.0),
    # The same with the agent preloading nothing: a smaller process forks faster (much so under gVisor's
    # ptrace platform), at the price of importing pandas/matplotlib in each run that uses them.
    ("  the same, preload none: runsc session", "p50:runsc preload=none: session execute, fork per run@1",
     "max-variant", 30.0),
    ("  the same, preload none: runsc one-shot", "p50:runsc preload=none: one-shot from warm pool@1", "max-variant",
     20.0),
    ("  the same, preload none: runc refill", "p50:runc preload=none: cold start (pool refill)@1", "max-variant",
     400.0),
    ("  the same, preload none: runsc refill", "p50:runsc preload=none: cold start (pool refill)@1", "max-variant",
     1000.0),
    ("warm plot / warm-interpreter floor", "ratio:plot", "max", 1.2),
    # The same plot with 0.3 s of think time before each run (off the clock): the idle spare of a box
    # that plots draws a throwaway figure of its own, so the run's first figure starts warm.
    ("  the same, 0.3 s idle between runs", "ratio:plot_idle", "max-variant", 1.2),
    ("idle jail box PSS (MB)", "pss:runtime system, preload none", "max", 12.0),
]


def collect(out: str, figures: dict[str, float]) -> None:
    for line in out.splitlines():
        if m := FIGURE.match(line):
            figures[f"fig:{m['name']}"] = float(m["value"])
        elif m := MEM.match(line):
            figures[f"pss:{m['name']}"] = float(m["pss"])
        elif m := ROW.match(line):
            key = f"p50:{m['name']}@{m['conc']}"
            figures.setdefault(key, float(m["p50"]))
    warm = figures.get("p50:warm: jail session, preloaded, import+plot@1")
    floor = figures.get("p50:floor: same warm interpreter, plot only@1")
    if warm and floor:
        figures["ratio:plot"] = warm / floor
    idle = figures.get("p50:warm: jail session, 0.3s idle, import+plot@1")
    if idle and floor:
        figures["ratio:plot_idle"] = idle / floor


def run_script(argv: list[str], limit: float) -> str:
    """Run one bench, echo and return its stdout. At its limit it gets SIGINT first, so its
    ``finally`` blocks shut providers down (no boxes or containers left), then SIGKILL."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        sys.stdout.write(out)
        print(f"!! {os.path.basename(argv[1])} stopped at its {limit:.0f} s limit")
        return out
    sys.stdout.write(out)
    if proc.returncode != 0:
        print(f"!! {os.path.basename(argv[1])} exited {proc.returncode}: {err[-800:]}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=840.0, help="seconds for all scripts together")
    args = ap.parse_args()
    py = sys.executable
    figures: dict[str, float] = {}
    start = time.monotonic()
    load0 = os.getloadavg()
    listed = {s for s, _, _ in SCRIPTS}
    others = sorted(f for f in os.listdir(HERE) if f.startswith("bench_") and f.endswith(".py") and f not in listed)
    # the other benches (local, remote, http extras, other providers) share what is left, 60 s each at most
    plan = SCRIPTS + [(f, [], 60.0 / args.budget) for f in others]
    for script, argv, share in plan:
        left = args.budget - (time.monotonic() - start)
        if left < 10.0:
            print(f"\n== {script}: skipped, the {args.budget:.0f} s budget is spent")
            continue
        limit = min(left, args.budget * share * 1.5)
        print(f"\n== {script} {' '.join(argv)} (limit {limit:.0f} s)", flush=True)
        out = run_script([py, os.path.join(HERE, script), *argv], limit)
        collect(out, figures)
    print("\nissue #21 targets (measured above, same run)")
    print(f"{'target':<40} {'figure':>10} {'target':>10}  result")
    misses = 0
    for label, key, kind, limit in TARGETS:
        value = figures.get(key)
        want = f"{'>=' if kind == 'min' else '<='} {limit:g}"  # kind: min, max, max-variant
        if value is None:
            print(f"{label:<40} {'-':>10} {want:>10}  not measured")
            continue
        ok = value >= limit if kind == "min" else value <= limit
        if kind.endswith("-variant"):
            print(f"{label:<40} {value:>10.2f} {want:>10}  {'ok' if ok else 'over'} (variant, not counted)")
            continue
        misses += not ok
        print(f"{label:<40} {value:>10.2f} {want:>10}  {'ok' if ok else 'MISS'}")
    cpus = os.cpu_count() or 1
    where = ("the eff/core column at c=16 above" if cpus >= 16 else
             f"needs 16 cores (this run: {cpus}); recorded in docs/benchmarks.md '16-core scaling'")
    print(f"{'>= 75 % of linear to 16 cores':<40} {'-':>10} {'>= 75 %':>10}  {where}")
    print(f"\n{misses} target(s) missed; {os.cpu_count()} cpus; load at start {load0[0]:.2f}, "
          f"at end {os.getloadavg()[0]:.2f}; {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
