"""Shared bench helpers: time a callable, run it at a concurrency, print a table with ratios.

Every bench script measures its subject and a baseline side by side in the same process and
prints p50, p95, throughput and the subject/baseline ratio. Nothing here asserts a threshold.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass


@dataclass
class Row:
    name: str
    samples_ms: list[float]
    wall_s: float
    concurrency: int
    baseline: str | None = None
    errors: int = 0

    @property
    def p50(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def p95(self) -> float:
        s = sorted(self.samples_ms)
        return s[min(len(s) - 1, int(round(0.95 * (len(s) - 1))))]

    @property
    def throughput(self) -> float:
        return len(self.samples_ms) / self.wall_s if self.wall_s else 0.0


def measure(name: str, fn: Callable[[], object], n: int = 200, concurrency: int = 1, warmup: int = 5,
            baseline: str | None = None, pause: float = 0.0) -> Row:
    """Call ``fn`` ``n`` times (spread over ``concurrency`` threads) after ``warmup`` calls;
    ``pause``: seconds of idle before each call, off the clock (a user's think time)."""
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    errors = 0

    def one() -> None:
        nonlocal errors
        if pause:
            time.sleep(pause)
        t = time.perf_counter()
        try:
            fn()
        except Exception:  # noqa: BLE001 - counted, shown in the table
            errors += 1
        samples.append((time.perf_counter() - t) * 1000)

    start = time.perf_counter()
    if concurrency == 1:
        for _ in range(n):
            one()
    else:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda _: one(), range(n)))
    wall = time.perf_counter() - start - n * pause / concurrency  # think time is not throughput
    return Row(name, samples, wall, concurrency, baseline, errors)


def print_table(title: str, rows: list[Row]) -> None:
    by_name = {r.name: r for r in rows}
    print(f"\n{title}")
    header = f"{'scenario':<44} {'conc':>4} {'n':>5} {'p50 ms':>9} {'p95 ms':>9} {'ops/s':>9} {'err':>4}  vs baseline"
    print(header)
    print("-" * len(header))
    for r in rows:
        ratio = ""
        base = by_name.get(r.baseline) if r.baseline else None
        if base is not None:
            ratio = f"p50 x{r.p50 / base.p50:.2f} ({r.baseline})"
        print(f"{r.name:<44} {r.concurrency:>4} {len(r.samples_ms):>5} {r.p50:>9.2f} {r.p95:>9.2f} "
              f"{r.throughput:>9.1f} {r.errors:>4}  {ratio}")


class CpuMeter:
    """CPU time of this process and *every* descendant, including boxes it never reaps.

    getrusage(RUSAGE_CHILDREN) misses a box's agent: bwrap is SIGKILLed with its box, so the
    agent is reaped by init and its CPU is lost. On a cgroup-v1 host with a cpuacct hierarchy
    (and root) the bench moves itself into a private cpuacct group, which every process it
    starts inherits (a box only joins its own memory/pids/cpu/freezer groups), so
    ``cpuacct.usage`` counts all of it. On cgroup v2 it does the same with a private group's
    ``cpu.stat``: the jail nests its boxes under the group it runs in. Kernel threads (loop I/O,
    unmount work) are not counted. Elsewhere it falls back to getrusage and says so in ``source``.
    CPU time is what makes a saving visible on a shared, loaded machine where wall-clock numbers
    are noisy.
    """

    V1 = "/sys/fs/cgroup/cpuacct"
    V2 = "/sys/fs/cgroup"

    def __init__(self) -> None:
        import os

        self.usage: str | None = None  # cpuacct.usage (ns) or cpu.stat (usage_usec) to read
        self.private: str | None = None  # the group this meter made and moved into
        self.home: str | None = None  # where close() moves this process back to
        self.source = "getrusage (self + reaped children; boxes' agents not counted)"
        if os.geteuid() != 0:
            return
        if os.path.isfile(os.path.join(self.V1, "cpuacct.usage")):
            if self._enter(self.V1, "cpuacct.usage"):
                self.source = "cpuacct (this process and all its descendants)"
        elif os.path.isfile(os.path.join(self.V2, "cgroup.controllers")):
            # v2: the jail nests its boxes (and its own leaf) under the cgroup it runs in
            with open("/proc/self/cgroup", encoding="ascii") as f:
                home = next((ln[3:].strip() for ln in f if ln.startswith("0::")), None)
            if home is not None:
                self._enter_v2(os.path.join(self.V2, home.lstrip("/")))

    def _enter(self, home: str, usage: str) -> bool:
        """Make a private group under ``home`` and move this process into it."""
        import os

        path = os.path.join(home, f"execbox-bench-{os.getpid()}")
        try:
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            return False
        self.usage, self.private, self.home = os.path.join(path, usage), path, home
        return True

    def _enter_v2(self, home: str) -> None:
        """In the root group: a private child with the controllers the jail needs for its boxes
        (the jail enables them there itself). Elsewhere the group we are in already holds
        everything the jail starts (its own leaf and its boxes nest under it), so its cpu.stat is
        the count, exact where nothing else runs in it (scripts/verify_device.sh gives the bench a
        group of its own)."""
        import os

        if os.path.basename(home) == "execbox-service":
            home = os.path.dirname(home)  # the jail's own leaf (cgroups._prepare_v2): its boxes are siblings
        if os.path.realpath(home) != os.path.realpath(self.V2):
            self.usage = os.path.join(home, "cpu.stat")
            self.source = f"cgroup v2 cpu.stat of {home} (this process's group and all nested in it)"
            return
        wanted = {"memory", "pids", "cpu"}
        try:
            with open(os.path.join(home, "cgroup.subtree_control"), "w") as f:
                f.write(" ".join(f"+{c}" for c in sorted(wanted)))
            with open(os.path.join(home, "cgroup.subtree_control")) as f:  # what a child gets
                if not wanted <= set(f.read().split()):
                    return  # a private child would lack them: the jail would run without limits
        except OSError:
            return
        if self._enter(home, "cpu.stat"):
            self.source = "cgroup v2 cpu.stat (this process and all its descendants)"

    def seconds(self) -> float:
        if self.usage is not None:
            with open(self.usage) as f:
                if self.usage.endswith("cpuacct.usage"):
                    return int(f.read()) / 1e9
                return next(int(ln.split()[1]) for ln in f if ln.startswith("usage_usec")) / 1e6
        import resource

        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    def close(self) -> None:
        """Move back to where this process was and remove the private group (if empty)."""
        import os

        if self.private is None or self.home is None:
            return  # nothing was moved (v2, reading the group we are in; or getrusage)
        try:
            with open(os.path.join(self.home, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            # the jail put its box parent (and, on v2, its own leaf) inside ours
            for sub in ("execbox", "execbox-service", ""):
                if os.path.isdir(os.path.join(self.private, sub)):
                    os.rmdir(os.path.join(self.private, sub))
        except OSError:
            pass
        self.private = None
