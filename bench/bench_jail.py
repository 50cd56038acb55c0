"""Bench: the jail provider beside its baselines, measured in the same run.

Rows: `print(1)` in a jail session and one-shot from the warm pool at concurrency 1 and 4; bash
`echo 1` in a session as a process per run and in a bash context (its long-lived shell); a fresh
`python3 -I -S -c` process and a fresh `bwrap ... python3 -I -S -c` box as baselines; pandas +
matplotlib plot in a preloaded session (warm) vs a box without preload and a fresh process (cold);
idle box memory. Prints tables only, asserts nothing.

    .venv/bin/python bench/bench_jail.py [-n 200] [--no-sci]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(__file__))

from _stats import Row, measure, print_table  # noqa: E402
from execbox.boxes import bwrap, runtime  # noqa: E402
from execbox.boxes.jail_box import host_uid  # noqa: E402
from execbox.providers.jail import JailProvider  # noqa: E402

PY = "/usr/bin/python3"
UID = host_uid()
PLOT = ("import pandas as pd, matplotlib.pyplot as plt\n"
        "df = pd.DataFrame({'x': range(100), 'y': [i * i for i in range(100)]})\n"
        "fig = plt.figure(); plt.plot(df.x, df.y); fig.savefig('plot.png'); plt.close(fig)\n")
CONFIG = {"max_memory": "512m", "disk_quota_mb": 64, "cpus": 1.0}


def drop_uid() -> None:
    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(UID, UID, UID)
        os.setresuid(UID, UID, UID)


def bare_bwrap_argv() -> list[str]:
    return ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", "1000", "--gid", "1000", *bwrap.system_mounts(), "--proc", "/proc", "--dev", "/dev",
            "--tmpfs", "/tmp", "--clearenv", "--", PY, "-I", "-S", "-c", "print(1)"]


def sessions(provider: JailProvider, cfg_name: str):
    """A per-thread session (one instance per worker thread), all destroyed at the end."""
    local = threading.local()
    made: list[str] = []
    lock = threading.Lock()

    def get() -> str:
        iid = getattr(local, "iid", None)
        if iid is None:
            iid = provider.create_instance(session_id=f"{cfg_name}-{threading.get_ident()}").instance_id
            local.iid = iid
            with lock:
                made.append(iid)
        return iid

    def close() -> None:
        for iid in made:
            provider.destroy_instance(iid)

    return get, close


def run_ok(provider: JailProvider, iid: str, code: str, expect: str = "1\n") -> None:
    r = provider.execute_code(iid, code, "python", 60)
    if r.exit_code != 0 or (expect and r.stdout != expect):
        raise RuntimeError(r.stderr[-300:] or r.stdout[-300:])


def _bash_ok(provider: JailProvider, iid: str, context_id: str | None) -> None:
    r = provider.execute_code(iid, "echo 1", "bash", 30, None, context_id=context_id)
    if r.stdout != "1\n":
        raise RuntimeError(f"unexpected result: {r.stdout!r} {r.stderr!r}")


def oneshot_from_pool(provider: JailProvider, n: int, concurrency: int) -> tuple[Row, float]:
    """create + run, each taken from a ready pool (refill time excluded); destroy off the clock."""
    samples: list[float] = []
    hits = 0
    lock = threading.Lock()
    reaper = ThreadPoolExecutor(2)

    def one() -> None:
        nonlocal hits
        t = time.perf_counter()
        inst = provider.create_instance()
        run_ok(provider, inst.instance_id, "print(1)")
        dt = (time.perf_counter() - t) * 1000
        with lock:
            samples.append(dt)
            hits += bool(inst.metadata["from_pool"])
        reaper.submit(provider.destroy_instance, inst.instance_id)

    busy = 0.0
    done = 0
    while done < n:
        batch = min(concurrency, n - done)
        while (provider.pool_status() or {}).get("ready", 0) < batch:
            time.sleep(0.01)
        t = time.perf_counter()
        with ThreadPoolExecutor(batch) as ex:
            list(ex.map(lambda _: one(), range(batch)))
        busy += time.perf_counter() - t
        done += batch
    reaper.shutdown(wait=True)
    return Row("jail one-shot print(1), warm pool", samples, busy, concurrency,
               "baseline: fresh python3 -I -S -c"), hits / max(1, n)


def oneshot_sustained(provider: JailProvider, n: int, concurrency: int) -> Row:
    """create + run + destroy back to back: includes cold starts once the pool runs dry."""
    def fn() -> None:
        inst = provider.create_instance()
        try:
            run_ok(provider, inst.instance_id, "print(1)")
        finally:
            provider.destroy_instance(inst.instance_id)

    return measure("jail one-shot print(1), sustained (+destroy)", fn, n=n, concurrency=concurrency, warmup=0,
                   baseline="baseline: fresh bwrap python3 -I -S -c")


def _kb(path: str, key: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def idle_memory(provider: JailProvider) -> tuple[float, float, float]:
    """(RSS sum, PSS sum, cgroup memory usage) in MB of one idle box's processes."""
    inst = provider.create_instance()
    try:
        time.sleep(0.5)
        box = provider._instances[inst.instance_id].box
        pids = box.cgroup.pids()
        rss = sum(_kb(f"/proc/{pid}/status", "VmRSS:") for pid in pids)
        pss = sum(_kb(f"/proc/{pid}/smaps_rollup", "Pss:") for pid in pids)
        cg = box.cgroup.memory_current() or 0
        return rss / 1024, pss / 1024, cg / 1024 / 1024
    finally:
        provider.destroy_instance(inst.instance_id)


FLOOR = (
    "import sys, time, json\n"
    "import pandas as pd, matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
    "code = sys.stdin.read()\nn = int(sys.argv[1])\nout = []\nt0 = time.perf_counter()\n"
    "for _ in range(n + 2):\n"
    "    t = time.perf_counter(); exec(code, {}); out.append((time.perf_counter() - t) * 1000)\n"
    "print(json.dumps([out[2:], time.perf_counter() - t0]))\n"
)


IDLE = 0.3
"""Seconds between warm plot runs in the think-time row (an LLM's pause is seconds)."""


def in_process_floor(sci_py: str, env: dict[str, str], n: int) -> Row:
    """The same plot run repeatedly inside one warm interpreter: no fork, no box, no protocol."""
    proc = subprocess.run([sci_py, "-I", "-c", FLOOR, str(n)], input=PLOT, capture_output=True, text=True,
                          env=env, cwd="/tmp", check=True)
    samples, wall = json.loads(proc.stdout)
    return Row("floor: same warm interpreter, plot only", samples, wall, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--no-sci", action="store_true", help="skip the pandas/matplotlib rows")
    args = ap.parse_args()
    n = args.n
    ok, reason = JailProvider.availability()
    if not ok:
        sys.exit(f"jail provider unavailable: {reason}")

    rows: list[Row] = []
    rows.append(measure("baseline: fresh python3 -I -S -c",
                        lambda: subprocess.run([PY, "-I", "-S", "-c", "print(1)"], check=True, capture_output=True),
                        n=max(20, n // 4)))
    argv = bare_bwrap_argv()
    rows.append(measure("baseline: fresh bwrap python3 -I -S -c",
                        lambda: subprocess.run(argv, check=True, capture_output=True, preexec_fn=drop_uid),
                        n=max(20, n // 4)))

    p = JailProvider()
    p.initialize({**CONFIG, "pool_size": 4, "preload": "none"})
    try:
        for conc in (1, 4):
            get, close = sessions(p, f"s{conc}")
            rows.append(measure("jail session print(1)", lambda get=get: run_ok(p, get(), "print(1)"), n=n,
                                concurrency=conc, baseline="baseline: fresh python3 -I -S -c"))
            if conc == 1:  # bash: a process per run vs. the context's long-lived shell
                iid = get()
                rows.append(measure("jail session bash echo 1", lambda iid=iid: _bash_ok(p, iid, None), n=n))
                rows.append(measure("jail session bash echo 1, bash context",
                                    lambda iid=iid: _bash_ok(p, iid, "sh"), n=n, baseline="jail session bash echo 1"))
            close()
        hit_rates = []
        for conc in (1, 4):
            row, hits = oneshot_from_pool(p, max(8, n // 10), conc)
            rows.append(row)
            hit_rates.append(hits)
        rows.append(oneshot_sustained(p, max(8, n // 20), 1))
        mem_sys = idle_memory(p)
    finally:
        p.shutdown()
    print_table("jail provider: print(1)", rows)
    print(f"warm-pool hit rate: {', '.join(f'{h:.0%}' for h in hit_rates)} (conc 1, 4)")

    mem_rows = [("runtime system, preload none", *mem_sys)]
    sci = any(r["name"] == "sci" for r in runtime.list_runtimes())
    if sci and not args.no_sci:
        plot_rows: list[Row] = []
        sci_py = os.path.join(runtime.resolve("sci").host_dir or "", "bin", "python")  # legacy or versioned layout
        env = {"PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg", "MPLCONFIGDIR": "/tmp/execbox-bench-mpl"}
        cold_n = max(3, n // 40)
        plot_rows.append(measure("cold: fresh sci python, import+plot",
                                 lambda: subprocess.run([sci_py, "-I", "-c", PLOT], check=True, capture_output=True,
                                                        env=env, cwd="/tmp"), n=cold_n, warmup=1))
        plot_rows.append(in_process_floor(sci_py, env, max(10, n // 10)))
        for preload, label in (("none", "cold: jail session, no preload"), ("auto", "warm: jail session, preloaded")):
            q = JailProvider()
            q.initialize({**CONFIG, "runtime": "sci", "preload": preload, "pool_size": 0})
            try:
                get, close = sessions(q, preload)
                plot_rows.append(measure(f"{label}, import+plot", lambda q=q, get=get: run_ok(q, get(), PLOT, ""),
                                         n=cold_n if preload == "none" else max(10, n // 10), warmup=2,
                                         baseline="cold: fresh sci python, import+plot"))
                if preload == "auto":  # with think time: the spare draws its own figure while idle
                    plot_rows.append(measure(f"warm: jail session, {IDLE}s idle, import+plot",
                                             lambda q=q, get=get: run_ok(q, get(), PLOT, ""), n=max(10, n // 10),
                                             warmup=2, pause=IDLE, baseline="cold: fresh sci python, import+plot"))
                close()
                if preload == "auto":
                    mem_rows.append(("runtime sci, preload auto",) + idle_memory(q))
            finally:
                q.shutdown()
        print_table("jail provider: import pandas, matplotlib + one plot", plot_rows)
    print("\nidle box memory")
    print(f"{'box':<32} {'RSS MB':>8} {'PSS MB':>8} {'cgroup MB':>10}")
    for name, rss, pss, cg in mem_rows:
        print(f"{name:<32} {rss:>8.1f} {pss:>8.1f} {cg:>10.1f}")
    print(f"\nhost: {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
