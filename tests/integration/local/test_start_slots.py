"""Callers' own box starts are bounded (AgentBackedProvider._start_slots): past the slots they
queue, and each still gets its box."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.timeout(120)


def test_cold_starts_beyond_the_slots_queue_and_all_succeed():
    from execbox.providers.local import LocalProvider

    p = LocalProvider()
    p.initialize({"max_memory": "256m", "pool_size": 0})
    p._start_slots = threading.BoundedSemaphore(2)
    real = p.start_oneshot_box
    lock = threading.Lock()
    now = peak = 0

    def counted(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        try:
            time.sleep(0.1)  # long enough for every caller to be waiting at once
            return real(*a, **kw)
        finally:
            with lock:
                now -= 1

    p.start_oneshot_box = counted

    def one(i: int) -> str:
        inst = p.create_instance()
        try:
            return p.execute_code(inst.instance_id, f"print({i})", "python", 30).stdout
        finally:
            p.destroy_instance(inst.instance_id)

    try:
        with ThreadPoolExecutor(6) as ex:
            outs = list(ex.map(one, range(6)))
    finally:
        p.shutdown()
    assert outs == [f"{i}\n" for i in range(6)]
    assert peak == 2
