"""Warm pool of started boxes: create_instance takes a ready one, a thread refills in the back.

A box is handed out once and never returns to the pool. Start failures are retried with
exponential backoff and stay visible in ``status()`` (for doctor, /readyz and metadata). A ready
box that ``stale`` says no longer fits (the jail's default runtime template moved to a newer
version) is never handed out: it is dropped and replaced, within STALE_RECHECK seconds or at the
next take, so it does not keep an old version mounted either.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ..errors import SandboxError, operator_message

log = logging.getLogger("execbox.pool")
REFILL_PAUSE = 0.02  # seconds a refill waits after a box was handed out (see _run)
SATURATED_HOLD = 0.5
"""Seconds the refill keeps holding off after callers' own box starts filled every CPU.

When as many callers start their own boxes (the pool was empty) as the host has CPUs, demand
is outrunning the refill: every request pays a start anyway, and a pooled box costs more CPU
than a caller's own one-shot box (a disk image a session could adopt, the imports a session's
forks share: ~10-15 ms). Refilling then only takes CPU from the requests (sustained one-shots on
2 cores: ~60 -> ~64/s without it). Below that (one request at a time, say) a CPU is idle and
the refill uses it, as before."""
STALE_RECHECK = 1.0  # seconds between the refill's looks for stale ready boxes (with ``stale``)


class PooledBox(Protocol):
    def alive(self) -> bool: ...

    def destroy(self) -> None: ...


class BoxPool:
    def __init__(self, start: Callable[[], PooledBox], size: int, name: str = "pool",
                 max_backoff: float = 30.0, workers: int = 2,
                 stale: Callable[[PooledBox], bool] | None = None) -> None:
        self._start = start
        self._stale = stale
        self._stale_warned = -1e9
        self.size = max(0, int(size))
        self.name = name
        self.max_backoff = max_backoff
        self._ready: deque[PooledBox] = deque()
        self._cond = threading.Condition()
        self._starting = 0
        self._closed = False
        self.failures = 0
        self.consecutive_failures = 0
        self.last_exception: Exception | None = None  # the newest start failure, whole: host paths and all
        self.last_error_at: float | None = None
        self.started_total = 0
        self.handed_out = 0
        self._last_take = 0.0
        self._cold = 0  # callers starting a box of their own right now (cold_start)
        self._saturated_until = float("-inf")
        self.cold_limit = os.cpu_count() or 1
        self._waiting = 0  # takes blocked on this pool: they want the refill, saturated or not
        # Box start-up is mostly waiting (exec, mounts, imports): a second starter keeps sustained
        # one-shot traffic from being limited by one start at a time.
        self._threads = [threading.Thread(target=self._run, name=f"execbox-{name}-{i}", daemon=True)
                         for i in range(max(1, min(workers, self.size)))]
        if self.size:
            for t in self._threads:
                t.start()

    def _run(self) -> None:
        backoff = 0.5
        while True:
            with self._cond:
                while not self._closed:
                    self._drop_stale()
                    if len(self._ready) + self._starting >= self.size:
                        self._cond.wait(timeout=STALE_RECHECK if self._stale is not None else None)
                        continue
                    hold = self._hold()
                    if hold <= 0:
                        break
                    self._cond.wait(timeout=hold)
                if self._closed:
                    return
                self._starting += 1
                # A box was just handed out: its first run is on the clock now. Starting the
                # replacement at once competes with it for the CPU and the GIL (~3 ms of a
                # warm one-shot), so the refill waits out that run's usual length first.
                pause = self._last_take + REFILL_PAUSE - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            try:
                box = self._start()
            except Exception as e:  # noqa: BLE001 - recorded and retried
                with self._cond:
                    self._starting -= 1
                    if self._closed:  # shutdown stopped the box it was starting: not a failure
                        self._cond.notify_all()
                        log.debug("pool %s: a box start ended by shutdown (%s)", self.name, e)
                        return
                    self.failures += 1
                    self.consecutive_failures += 1
                    self.last_exception = e.with_traceback(None)  # not the frames of the failed start
                    self.last_error_at = time.time()
                    self._cond.notify_all()
                log.warning("pool %s: box start failed (%s); retrying in %.1fs", self.name, e, backoff)
                until = time.monotonic() + backoff
                with self._cond:  # the whole backoff: a waiting take() wakes the others, not this
                    while not self._closed and (left := until - time.monotonic()) > 0:
                        self._cond.wait(timeout=left)
                backoff = min(backoff * 2, self.max_backoff)
                continue
            backoff = 0.5
            with self._cond:
                self._starting -= 1
                self.started_total += 1
                self.consecutive_failures = 0
                if self._closed:
                    box.destroy()
                    return
                self._ready.append(box)
                self._cond.notify_all()

    def take(self, wait: float = 0.0, give_up: Callable[[], bool] | None = None) -> PooledBox | None:
        """A ready, live box, waiting up to ``wait`` seconds; None if none came. ``give_up`` is asked
        (with the pool's lock held: it must only read) whenever the wait finds no box; True ends it
        (a refill that failed for a reason no retry within ``wait`` will cure)."""
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                while self._ready:
                    box = self._ready.popleft()
                    self._cond.notify_all()
                    if box.alive() and not self._is_stale(box):
                        self.handed_out += 1
                        self._last_take = time.monotonic()
                        promote = getattr(box, "promote", None)
                        if promote is not None:  # a jail box started at a low CPU weight
                            promote()
                        return box
                    threading.Thread(target=box.destroy, daemon=True).start()
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed or not self.size or (give_up is not None and give_up()):
                    return None
                self._waiting += 1
                self._cond.notify_all()  # a refill holding off starts now
                try:
                    self._cond.wait(timeout=remaining)
                finally:
                    self._waiting -= 1

    def _is_stale(self, box: PooledBox) -> bool:
        if self._stale is None:
            return False
        try:
            return self._stale(box)
        except Exception as e:  # noqa: BLE001 - cannot tell: keep it (a check failing every time
            # would otherwise destroy and restart every ready box each STALE_RECHECK, for ever)
            now = time.monotonic()
            if now - self._stale_warned > 60:
                self._stale_warned = now
                log.warning("pool %s: cannot tell whether a ready box is stale (%s); keeping it", self.name, e)
            return False

    def _drop_stale(self) -> None:
        """Remove the stale ready boxes (called with the lock held) and destroy them in the back."""
        if self._stale is None or not self._ready:
            return
        stale = [box for box in self._ready if self._is_stale(box)]
        if not stale:
            return
        gone = {id(box) for box in stale}
        self._ready = deque(box for box in self._ready if id(box) not in gone)
        log.info("pool %s: replacing %d ready box(es) whose runtime is no longer current", self.name, len(stale))
        for box in stale:
            threading.Thread(target=box.destroy, daemon=True).start()

    @contextlib.contextmanager
    def cold_start(self) -> Iterator[None]:
        """Around a caller's own box start after ``take`` found nothing (see SATURATED_HOLD)."""
        with self._cond:
            self._cold += 1  # at cold_limit, _hold() holds the refill for as long as this lasts
        try:
            yield
        finally:
            with self._cond:
                if self._cold >= self.cold_limit:  # saturated until now: hold a while longer
                    self._saturated_until = time.monotonic() + SATURATED_HOLD
                self._cold -= 1
                self._cond.notify_all()

    def _hold(self) -> float:
        """Seconds the refill should still wait (called with the lock held); <= 0: go."""
        if self._waiting:
            return 0.0
        if self._cold >= self.cold_limit:
            return SATURATED_HOLD
        return self._saturated_until - time.monotonic()

    @property
    def last_error(self) -> str | None:
        """The newest start failure, whole, as ``status()`` reports it."""
        e = self.last_exception
        if e is None:
            return None
        return f"{type(e).__name__}: {operator_message(e) if isinstance(e, SandboxError) else e}"

    def status(self) -> dict[str, Any]:
        with self._cond:
            return {
                "size": self.size,
                "ready": len(self._ready),
                "starting": self._starting,
                "started_total": self.started_total,
                "handed_out": self.handed_out,
                "failures": self.failures,
                "healthy": self.consecutive_failures == 0,
                "refill_held": self._hold() > 0,
                "last_error": self.last_error,
                "last_error_at": self.last_error_at,
            }

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the starter threads to end (after close); True if all did."""
        for t in self._threads:
            if t.is_alive():
                t.join(timeout)
        return not any(t.is_alive() for t in self._threads)

    @property
    def _thread(self) -> threading.Thread:  # compatibility: the first starter thread
        return self._threads[0]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            boxes = list(self._ready)
            self._ready.clear()
            self._cond.notify_all()
        for box in boxes:
            try:
                box.destroy()
            except Exception:  # noqa: BLE001
                log.exception("pool %s: destroying a ready box failed", self.name)
