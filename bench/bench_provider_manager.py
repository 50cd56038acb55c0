"""Bench: the per-execution cost of hot reload and auth, on SQLite (and PostgreSQL with --pg-url).

Rows: ProviderManager.current() checking the settings version on every call (the default), the
same throttled to one check a minute (baseline: a pure in-memory lookup), a naive full reload per
call (re-read and re-validate the stored config, what a version check avoids), and a bearer
token verification (one indexed lookup of a SHA-256).

    .venv/bin/python bench/bench_provider_manager.py [-n 2000] [--pg-url postgresql://...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

from _stats import measure, print_table  # noqa: E402
from execbox.service.crypto import KeyRing, generate_key  # noqa: E402
from execbox.service.provider_manager import ProviderManager  # noqa: E402
from execbox.service.store import open_store  # noqa: E402


def bench_store(label: str, url: str | None, n: int) -> list:
    data = tempfile.mkdtemp(prefix="execbox-bench-")
    store = open_store(data, url=url)
    ring = KeyRing(generate_key())
    live = ProviderManager(store, keyring=ring, env={"SANDBOX_TYPE": "local"})
    throttled = ProviderManager(store, keyring=ring, env={}, check_interval=60)
    _, token = store.tokens.create("bench")
    rows = []
    try:
        base = f"{label}: current(), checked once a minute"
        rows.append(measure(base, throttled.current, n=n))
        rows.append(measure(f"{label}: current(), version check every call", live.current, n=n, baseline=base))
        rows.append(measure(f"{label}: current(), every call, 4 threads", live.current, n=n, concurrency=4,
                            baseline=base))
        rows.append(measure(f"{label}: naive full reload per call",
                            lambda: live.settings.effective("local"), n=n // 4, baseline=base))
        rows.append(measure(f"{label}: token verify", lambda: store.tokens.verify(token), n=n, baseline=base))
    finally:
        live.shutdown()
        throttled.shutdown()
        store.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("--pg-url", default=os.environ.get("EXECBOX_BENCH_PG_URL"))
    args = ap.parse_args()
    rows = bench_store("sqlite", None, args.n)
    if args.pg_url:
        rows += bench_store("postgres", args.pg_url, args.n)
    print_table("hot reload and auth cost per execution (baseline: in-memory lookup)", rows)


if __name__ == "__main__":
    main()
