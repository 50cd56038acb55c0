"""Bench: `print(1)` through the local provider, one-shot and in a session, at concurrency 1 and 4,
beside a fresh `python3 -I -S -c` process (the baseline) measured in the same run.

    .venv/bin/python bench/bench_local.py [-n 300]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))

from _stats import Row, measure, print_table  # noqa: E402
from execbox import Sandbox  # noqa: E402
from execbox.providers.local import LocalProvider  # noqa: E402

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def with_think_time(name: str, fn, n: int, think: float = 0.01, baseline: str | None = None) -> Row:
    """Like a caller that looks at each result before sending the next run: the pause is not
    timed, so the agent's ahead-of-time fork (the spare child) can finish in it."""
    samples = []
    busy = 0.0
    for _ in range(n):
        time.sleep(think)
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
        busy += time.perf_counter() - t
    return Row(name, samples, busy, 1, baseline)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=300)
    n = ap.parse_args().n
    rows = []

    def fresh() -> None:
        subprocess.run([PY, "-I", "-S", "-c", "print(1)"], check=True, capture_output=True)

    rows.append(measure("baseline: fresh python3 -I -S -c", fresh, n=n // 3))

    provider = LocalProvider()
    provider.initialize({"pool_size": 4})
    try:
        with Sandbox.create(provider) as sb:
            def session_run() -> None:
                r = sb.run_code("print(1)")
                assert r.stdout == "1\n", r

            rows.append(measure("local session exec", session_run, n=n,
                                baseline="baseline: fresh python3 -I -S -c"))
            rows.append(with_think_time("local session exec, 10 ms think time", session_run, n // 2,
                                        baseline="local session exec"))

        local = threading.local()
        sandboxes: list[Sandbox] = []
        lock = threading.Lock()

        def session_run_c4() -> None:
            sb4 = getattr(local, "sb", None)
            if sb4 is None:
                sb4 = local.sb = Sandbox.create(provider)
                with lock:
                    sandboxes.append(sb4)
            assert sb4.run_code("print(1)").stdout == "1\n"

        rows.append(measure("local session exec (4 sessions)", session_run_c4, n=n, concurrency=4,
                            baseline="baseline: fresh python3 -I -S -c"))
        for s in sandboxes:
            s.close()

        def oneshot() -> None:
            inst = provider.create_instance()
            try:
                r = provider.execute_code(inst.instance_id, "print(1)", "python", 10)
                assert r.stdout == "1\n"
            finally:
                provider.destroy_instance(inst.instance_id)

        rows.append(measure("local one-shot (warm pool of 4)", oneshot, n=max(20, n // 5),
                            baseline="baseline: fresh python3 -I -S -c"))
        rows.append(measure("local one-shot (warm pool of 4)", oneshot, n=max(20, n // 5), concurrency=4,
                            baseline="baseline: fresh python3 -I -S -c"))
    finally:
        provider.shutdown()
    print_table(f"execbox local provider, print(1), {os.cpu_count()} cores", rows)


if __name__ == "__main__":
    main()
