"""The warm pool's refill policy (boxes/pool.py): it holds off while callers' own box starts
fill every CPU, and refills into idle CPU otherwise or when someone waits for a box."""

from __future__ import annotations

import threading
import time

import pytest

from execbox.boxes import pool as pool_mod
from execbox.boxes.pool import BoxPool

HOLD = 0.6


class FakeBox:
    def __init__(self) -> None:
        self.destroyed = False

    def alive(self) -> bool:
        return not self.destroyed

    def destroy(self) -> None:
        self.destroyed = True


class Starts:
    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self) -> FakeBox:
        with self.lock:
            self.n += 1
        return FakeBox()


def wait_for(cond, timeout: float = 5.0) -> bool:  # noqa: ANN001
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@pytest.fixture
def drained(monkeypatch):
    """A pool of 3 (one refill worker, 2 CPUs' worth of cold starts saturate it), emptied."""
    monkeypatch.setattr(pool_mod, "SATURATED_HOLD", HOLD)
    monkeypatch.setattr(pool_mod, "REFILL_PAUSE", 0.1)
    starts = Starts()
    p = BoxPool(starts, 3, workers=1)
    p.cold_limit = 2
    assert wait_for(lambda: p.status()["ready"] == 3)
    yield p, starts
    p.close()


def test_cold_starts_on_every_cpu_hold_the_refill_off_until_they_stop(drained):
    p, starts = drained
    with p.cold_start(), p.cold_start():  # two callers start their own boxes: the host is full
        assert all(p.take() is not None for _ in range(3))
        assert p.status()["refill_held"] is True
        time.sleep(HOLD)
        # a start that was under way before the cold starts (if the worker got there first)
        # finished; no other began
        assert starts.n in (3, 4) and p.status()["ready"] == starts.n - 3
        stopped = time.monotonic()
    assert p.status()["refill_held"] is True  # still, for SATURATED_HOLD after the last
    assert wait_for(lambda: p.status()["ready"] == 3)
    assert time.monotonic() - stopped >= HOLD * 0.9 and starts.n == 6
    assert p.status()["refill_held"] is False


def test_below_the_cpu_count_the_refill_goes_on(drained):
    p, starts = drained
    with p.cold_start():  # one caller at a time: a CPU is idle, the refill takes it
        assert all(p.take() is not None for _ in range(3))
        assert p.status()["refill_held"] is False
        assert wait_for(lambda: p.status()["ready"] == 3, timeout=HOLD * 0.8)
    assert starts.n == 6


def test_a_waiting_caller_is_served_although_the_refill_holds(drained):
    p, starts = drained
    with p.cold_start(), p.cold_start():
        assert all(p.take() is not None for _ in range(3))
        time.sleep(0.2)
        t = time.monotonic()
        assert p.take(wait=5.0) is not None  # someone waits for the pool: it refills for them
        assert time.monotonic() - t < HOLD


def test_a_start_that_shutdown_ends_is_not_a_failure_nor_retried(caplog):
    """Closing the provider kills the box a refill is starting; that start then fails. It is the
    shutdown, not a broken host: no warning, no failure count, no retry."""
    started, release = threading.Event(), threading.Event()
    calls = []

    def start() -> FakeBox:
        calls.append(1)
        started.set()
        release.wait(5)
        raise RuntimeError("agent failed to start (stream closed)")

    p = BoxPool(start, size=1, workers=1)
    assert started.wait(5)
    p.close()
    with caplog.at_level("DEBUG", logger="execbox.pool"):
        release.set()
        assert wait_for(lambda: not p._threads[0].is_alive())
    assert p.failures == 0 and p.last_error is None and len(calls) == 1
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_failing_pool_keeps_its_backoff_while_callers_wait():
    """A waiting take() wakes the refill; it used to wake the starter out of its backoff too, so a
    pool failing to start boxes retried back to back while callers kept asking (thousands of
    starts a second), hammering a broken engine. Backoff 0.5 s, then 1 s: one worker starts at
    most 3 times in 1.2 s of callers arriving every 50 ms."""
    calls = []

    def start() -> FakeBox:
        calls.append(time.monotonic())
        raise RuntimeError("engine refused")

    p = BoxPool(start, size=1, workers=1)
    try:
        end = time.monotonic() + 1.2
        while time.monotonic() < end:
            assert p.take(wait=0.05) is None
        assert 1 <= len(calls) <= 3, len(calls)
    finally:
        p.close()


def test_a_stale_check_that_fails_keeps_the_ready_boxes(monkeypatch):
    """Review 53 F4: a check that raised counted as stale, so one failing every time destroyed and
    restarted every ready box each STALE_RECHECK, and none was ever handed out."""
    monkeypatch.setattr(pool_mod, "STALE_RECHECK", 0.05)
    starts = Starts()

    def broken(_box: FakeBox) -> bool:
        raise OSError("readlink failed")

    p = BoxPool(starts, 2, workers=1, stale=broken)
    try:
        assert wait_for(lambda: p.status()["ready"] == 2)
        time.sleep(0.5)  # ten rechecks
        assert starts.n == 2
        assert p.take(wait=1) is not None
    finally:
        p.close()
