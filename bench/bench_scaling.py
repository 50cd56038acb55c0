"""Scaling bench: jail session runs and sustained one-shots at concurrency 1, 2, 4, 8, 16.

For each concurrency it prints runs/s, the speed-up over concurrency 1, the efficiency per core
(runs/s divided by runs/s at c=1 times min(c, cores)) and the CPU cost per run (this process and
every descendant, boxes included: _stats.CpuMeter), so a saving shows up even when the shared
machine makes wall-clock numbers noisy. ``cores / CPU per run`` is the throughput the host could
reach if nothing else ran on it ("CPU-bound runs/s"). The issue's target (>= 75 % of linear to 16
cores for session runs) can only be checked on a 16-core machine; on fewer cores the efficiency
column is relative to the cores present. "service ms/run" is the CPU of this process alone (the
provider: one interpreter, one GIL), the share that cannot spread over cores. Prints tables only,
asserts nothing.

    .venv/bin/python bench/bench_scaling.py [--n 200] [--oneshot-n 40] [--conc 1,2,4,8,16] [--procs P]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _stats import CpuMeter  # noqa: E402
from execbox.providers.jail import JailProvider  # noqa: E402

CONFIG = {"max_memory": "512m", "disk_quota_mb": 64, "cpus": 1.0, "preload": "none"}


METER: CpuMeter | None = None


def cpu_seconds() -> float:
    return METER.seconds() if METER is not None else own_cpu()  # a worker process: unused there


def run_ok(p: JailProvider, iid: str) -> None:
    r = p.execute_code(iid, "print(1)", "python", 60)
    if r.exit_code != 0 or r.stdout != "1\n":
        raise RuntimeError(r.stderr[-300:] or r.stdout[-300:])


def own_cpu() -> float:
    """CPU of this process alone: the provider's threads, i.e. the service side of every run (one
    interpreter, one GIL: the part that cannot scale past one core)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def drive(fn, n: int, conc: int) -> tuple[float, float, float, int]:
    """(wall seconds, CPU seconds, service CPU seconds, errors) for ``n`` calls of ``fn`` over
    ``conc`` threads."""
    errors = 0
    lock = threading.Lock()

    def one(_: int) -> None:
        nonlocal errors
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - counted in the table
            with lock:
                errors += 1
            print(f"  error: {e}", file=sys.stderr)

    c0, s0, t0 = cpu_seconds(), own_cpu(), time.perf_counter()
    with ThreadPoolExecutor(conc) as ex:
        list(ex.map(one, range(n)))
    return time.perf_counter() - t0, cpu_seconds() - c0, own_cpu() - s0, errors


def session_runs(p: JailProvider, n: int, conc: int, ready=None) -> tuple[float, float, float, int]:
    local = threading.local()
    made: list[str] = []
    lock = threading.Lock()

    def fn() -> None:
        iid = getattr(local, "iid", None)
        if iid is None:
            iid = p.create_instance(session_id=f"scale-{conc}-{threading.get_ident()}").instance_id
            local.iid = iid
            with lock:
                made.append(iid)
        run_ok(p, iid)

    # one warm-up round opens every worker's session off the clock
    drive(fn, conc * 2, conc)
    try:
        if ready is not None:
            ready()
        return drive(fn, n, conc)
    finally:
        for iid in made:
            p.destroy_instance(iid)


def oneshots(p: JailProvider, n: int, conc: int) -> tuple[float, float, float, int]:
    def fn() -> None:
        inst = p.create_instance()
        try:
            run_ok(p, inst.instance_id)
        finally:
            p.destroy_instance(inst.instance_id)

    return drive(fn, n, conc)


def _proc_worker(conn, n: int, threads: int, barrier) -> None:
    """One service process of the multi-process variant: its own provider, ``threads`` sessions."""
    p = JailProvider()
    p.initialize({**CONFIG, "pool_size": 0})
    try:
        conn.send(session_runs(p, n, threads, ready=lambda: barrier.wait(timeout=120)))
    finally:
        p.shutdown()
        conn.close()


def session_runs_procs(procs: int, n: int, conc: int) -> tuple[int, float, float, float, int]:
    """Session runs at concurrency ``conc`` spread over up to ``procs`` service processes, as
    replicas on one host would serve them (docs/sessions.md): each process has its own provider and
    interpreter, so the service side is no longer one GIL. All start measuring together (a barrier
    after their warm-up); CPU is the whole group's (CpuMeter), service CPU the sum of theirs."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of the parent's providers
    used = min(procs, conc)
    barrier = ctx.Barrier(used + 1)
    pipes, workers, total = [], [], 0
    for i in range(used):
        threads = conc // used + (1 if i < conc % used else 0)
        runs = n * threads // conc  # this process's share of the n runs
        total += runs
        parent_end, child_end = ctx.Pipe(duplex=False)
        w = ctx.Process(target=_proc_worker, args=(child_end, runs, threads, barrier))
        w.start()
        pipes.append(parent_end)
        workers.append(w)
    barrier.wait(timeout=120)
    c0 = cpu_seconds()
    out = []
    for conn in pipes:
        if not conn.poll(600):
            raise RuntimeError("a service process sent no result in 600 s")
        out.append(conn.recv())
    cpu = cpu_seconds() - c0
    for w in workers:
        w.join(60)
    return total, max(o[0] for o in out), cpu, sum(o[2] for o in out), sum(o[3] for o in out)


def table(title: str, results: list[tuple[int, int, float, float, float, int]], figures: list[str]) -> None:
    cores = os.cpu_count() or 1
    print(f"\n{title}")
    header = (f"{'conc':>4} {'n':>5} {'runs/s':>9} {'speed-up':>9} {'eff/core':>9} "
              f"{'CPU ms/run':>11} {'service ms/run':>15} {'CPU-bound runs/s':>17} {'err':>4}")
    print(header)
    print("-" * len(header))
    base = None
    for conc, n, wall, cpu, service, err in results:
        rate = n / wall if wall else 0.0
        base = base or rate
        speed = rate / base if base else 0.0
        eff = speed / min(conc, cores)
        bound = cores / (cpu / n) if cpu > 0 else 0.0
        print(f"{conc:>4} {n:>5} {rate:>9.1f} {speed:>8.2f}x {eff:>8.0%} {cpu / n * 1000:>11.1f} "
              f"{service / n * 1000:>15.2f} {bound:>17.1f} {err:>4}")
        figures.append(f"figure: {title.split(':')[0]} c={conc} runs/s: {rate:.1f}")
        print(figures[-1])
        figures.append(f"figure: {title.split(':')[0]} c={conc} CPU ms/run: {cpu / n * 1000:.1f}")
        print(figures[-1])
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200, help="session runs per concurrency")
    ap.add_argument("--oneshot-n", type=int, default=40, help="sustained one-shots per concurrency")
    ap.add_argument("--conc", default="1,2,4,8,16")
    ap.add_argument("--pool", type=int, default=4, help="warm pool size (drained by sustained one-shots)")
    ap.add_argument("--procs", type=int, default=0,
                    help="also run the session runs over this many service processes (replicas on one host)")
    args = ap.parse_args()
    global METER
    METER = CpuMeter()  # before any box: a jail start may move this process into a leaf group
    ok, reason = JailProvider.availability()
    if not ok:
        sys.exit(f"jail provider unavailable: {reason}")
    concs = [int(c) for c in args.conc.split(",")]
    load0 = os.getloadavg()[0]
    print(f"CPU per run measured by {METER.source}")
    p = JailProvider()
    p.initialize({**CONFIG, "pool_size": args.pool})
    figures: list[str] = []
    try:  # each table is printed as soon as it is measured, so a run cut short still reports
        sess = [(c, args.n, *session_runs(p, args.n, c)) for c in concs]
        table("jail session print(1): scaling", sess, figures)
        shots = [(c, args.oneshot_n, *oneshots(p, args.oneshot_n, c)) for c in concs]
        table("jail sustained one-shot: create+run+destroy, pool drained: scaling", shots, figures)
    finally:
        p.shutdown()
    try:
        if args.procs > 1:
            multi = [(c, *session_runs_procs(args.procs, args.n, c)) for c in concs]
            table(f"jail session print(1) over up to {args.procs} service processes: scaling", multi, figures)
    finally:
        METER.close()
    print(flush=True)
    cores = os.cpu_count() or 1
    print(f"\nhost: {cores} cpus, load {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    if cores < 16:
        print("note: fewer than 16 cores; the >= 75 % of linear to 16 cores target is checked on a 16-core "
              "machine (docs/benchmarks.md '16-core scaling')")


if __name__ == "__main__":
    main()
