"""Docker provider latency: session execute and warm-pool one-shot, runc and runsc, side by side with
a `docker exec`-per-run baseline measured in the same run against the same containers.

    .venv/bin/python bench/bench_docker.py [--n 100] [--oneshot-n 20] [--runtimes runc,runsc]

Stateless session runs fork the agent (with and without think time between runs); context runs
reuse one long-lived child; a one-shot's single run uses the pooled box's spare child. One-shot
samples are taken with a ready container in the pool (the refill wait is not timed): the
number is what a caller sees when the pool is sized for its load. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _stats import Row, print_table  # noqa: E402
from execbox.providers.docker import DockerProvider, docker_client  # noqa: E402


def wait_ready(p: DockerProvider, n: int = 1, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while p.pool_status()["ready"] < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"pool did not refill: {p.pool_status()}")
        time.sleep(0.02)


def timed(fn, n: int, before=None) -> tuple[list[float], float, int]:
    samples, errors, wall = [], 0, 0.0
    for _ in range(n):
        if before is not None:
            before()
        t = time.perf_counter()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - counted in the table
            errors += 1
            print(f"  error: {e}", file=sys.stderr)
        dt = time.perf_counter() - t
        wall += dt
        samples.append(dt * 1000)
    return samples, wall, errors


def bench_runtime(runtime: str, n: int, oneshot_n: int, pool: int, preload: str) -> list[Row]:
    p = DockerProvider()
    p.initialize({"runtime": runtime, "pool_size": pool, "pool_wait": 300, "preload": preload})
    rows: list[Row] = []
    label = runtime if preload == "auto" else f"{runtime} preload={preload}"  # auto: the default rows
    try:
        wait_ready(p, pool)
        inst = p.create_instance(tenant_id="bench", session_id="s")
        box = p._instances[inst.instance_id].box
        api = p.docker.api

        def session() -> None:
            r = p.execute_code(inst.instance_id, "print(1)", "python")
            assert r.stdout == "1\n", r.stderr

        def docker_exec() -> None:
            eid = api.exec_create(box.container_id, ["/usr/bin/python3", "-I", "-S", "-c", "print(1)"],
                                  user="1000:1000")["Id"]
            out = api.exec_start(eid)
            assert out == b"1\n", out

        def session_context() -> None:
            r = p.execute_code(inst.instance_id, "print(1)", "python", context_id="bench")
            assert r.stdout == "1\n", r.stderr

        for _ in range(5):
            session()
            session_context()
            docker_exec()
        base = f"{label}: docker exec per run"
        s, w, e = timed(docker_exec, n)
        rows.append(Row(base, s, w, 1, None, e))
        s, w, e = timed(session, n)
        rows.append(Row(f"{label}: session execute, fork per run", s, w, 1, base, e))
        s, w, e = timed(session, max(10, n // 3), before=lambda: time.sleep(0.3))
        rows.append(Row(f"{label}: session execute, 300 ms think time", s, w, 1, base, e))
        s, w, e = timed(session_context, n)
        rows.append(Row(f"{label}: session execute in a context", s, w, 1, base, e))
        p.destroy_instance(inst.instance_id)

        def oneshot() -> None:
            i = p.create_instance(tenant_id="bench", session_id=None)
            try:
                r = p.execute_code(i.instance_id, "print(1)", "python")
                assert r.stdout == "1\n", r.stderr
            finally:
                p.destroy_instance(i.instance_id)

        s, w, e = timed(oneshot, oneshot_n, before=lambda: wait_ready(p, 1))
        rows.append(Row(f"{label}: one-shot from warm pool", s, w, 1, base, e))

        def cold_start() -> None:
            p.start_box().destroy()

        s, w, e = timed(cold_start, 3)
        rows.append(Row(f"{label}: cold start (pool refill)", s, w, 1, None, e))
    finally:
        p.shutdown()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--oneshot-n", type=int, default=20)
    ap.add_argument("--pool", type=int, default=2)
    ap.add_argument("--preload", default="auto",
                    help="agent preload: auto (numpy, pandas, matplotlib) or none; rows of other than auto are "
                         "labelled '<runtime> preload=<value>'")
    ap.add_argument("--runtimes", default="runc,runsc")
    args = ap.parse_args()
    client = docker_client()
    known = set(client.info().get("Runtimes") or {})
    rows: list[Row] = []
    for rt in args.runtimes.split(","):
        if rt not in known:
            print(f"skipping {rt}: not registered with dockerd")
            continue
        rows += bench_runtime(rt, args.n, args.oneshot_n, args.pool, args.preload)
    print_table("docker provider: execute latency (python print(1))", rows)
    print("targets (issue 6): runsc session execute p50 <= 30 ms; runsc one-shot from warm pool p50 <= 60 ms")


if __name__ == "__main__":
    main()
