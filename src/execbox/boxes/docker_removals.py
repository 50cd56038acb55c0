"""Container removals that must happen eventually: retried until the engine lets them.

A box's host side (its session's workspace image mounted on the host, its uid) is released only
once its container is gone (docker_host.py). A removal that failed because dockerd was down used
to be dropped: the workspace stayed mounted, and every later box of that session waited
``quota.RELEASE_WAIT_SECONDS`` (30 s) for it and failed, until the service restarted (review 40).
Now every removal is tracked here until it succeeds:

* in the background, retried with backoff (``RETRY_FIRST`` doubling to ``RETRY_MAX`` seconds), so
  the uid and mounts come back once the engine does, whether or not the session is used again;
* inline, before a new box of the same workspace starts (``settle``): the session recovers on its
  first request after the engine is back, and while the engine does not answer that request gets
  a quick SB009 "the Docker engine is unavailable" (``engine_unavailable``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import ProviderUnavailableError
from .pool import BoxPool

log = logging.getLogger("execbox.docker")

RETRY_FIRST = 0.5
RETRY_MAX = 30.0
ENGINE_RETRY_AFTER = 2
"""Retry-After (seconds) of the SB009 a request gets while the engine does not answer."""


def engine_unreachable(e: BaseException) -> bool:
    """Did a Docker call fail because the engine does not answer (stopped, restarting, its socket
    gone, a connection cut mid-request)? Not for the engine's own refusals (HTTP errors)."""
    try:
        import requests
    except ImportError:  # a jail-only host
        requests = None  # type: ignore[assignment]
    if requests is not None and isinstance(e, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
        return True
    return isinstance(e, (ConnectionError, TimeoutError))


def engine_down(pool: BoxPool, since: float) -> bool:
    """A warm pool's refills fail, the newest (at or after ``since``, epoch s) because the engine is
    not there (connection refused, no socket): a caller waiting for the pool may stop. A refill that
    timed out is not that: a slow engine may still start the next one within the caller's wait."""
    e, at = pool.last_exception, pool.last_error_at
    return bool(pool.consecutive_failures) and e is not None and at is not None and at >= since \
        and engine_unreachable(e) and not _timed_out(e)


def _timed_out(e: BaseException) -> bool:
    try:
        import requests
    except ImportError:  # a jail-only host
        return isinstance(e, TimeoutError)
    return isinstance(e, (requests.exceptions.Timeout, TimeoutError))


def engine_unavailable(provider: str = "docker", what: str = "") -> ProviderUnavailableError:
    """503 SB009 for a request that needs the engine while it does not answer."""
    err = ProviderUnavailableError(
        f"{provider}: the Docker engine is unavailable{what}; retry once it is back",
        details={"reason": "docker_engine_unavailable", "provider": provider, "retry_after": ENGINE_RETRY_AFTER})
    err.retry_after = ENGINE_RETRY_AFTER  # type: ignore[attr-defined]
    return err


@dataclass(eq=False)
class _Removal:
    key: str
    attempt: Callable[[], None]  # removes the container, then releases its host side; raises on failure
    workspace: str | None
    name: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: bool = False
    tries: int = 0
    due: float = float("inf")  # when the retry thread tries next (inf: not scheduled)
    error: BaseException | None = None


def _norm(path: str | None) -> str | None:
    return os.path.abspath(path) if path else None


class Removals:
    """The provider's removals not yet done: tried once in the background (``submit``), then
    retried until they succeed or ``close``."""

    def __init__(self, submit: Callable[[Callable[[], None]], None] | None = None,
                 first: float = RETRY_FIRST, most: float = RETRY_MAX) -> None:
        self._submit = submit
        self.first = first
        self.most = most
        self._cond = threading.Condition()
        self._items: dict[str, _Removal] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, key: str, attempt: Callable[[], None], workspace: str | None, name: str = "",
            background: bool = True) -> None:
        """Track one removal; its first try runs now (``background``: via ``submit``)."""
        item = _Removal(key, attempt, _norm(workspace), name or key[:12])
        with self._cond:
            self._items[key] = item
        if background and self._submit is not None:
            self._submit(lambda: self._try(item))
        else:
            self._try(item)

    def pending(self, workspace: str | None = None) -> list[str]:
        """Keys of removals not done yet (of ``workspace`` only, when given)."""
        ws = _norm(workspace)
        with self._cond:
            return [k for k, i in self._items.items() if workspace is None or i.workspace == ws]

    def settle(self, workspace: str, provider: str = "docker") -> None:
        """Before a new box of ``workspace`` starts: finish its previous boxes' removals now (their
        containers hold its mount). SB009 ``engine_unavailable`` when the engine does not answer;
        another failure is left to the caller's wait for the mount (and to the retries)."""
        ws = _norm(workspace)
        with self._cond:
            items = [i for i in self._items.values() if i.workspace == ws]
        for item in items:
            failed = self._try(item)
            if failed is not None and engine_unreachable(failed):
                raise engine_unavailable(provider, " (the session's previous box cannot be removed yet)") from None

    def _try(self, item: _Removal) -> BaseException | None:
        with item.lock:  # one try of an item at a time: settle and the retry thread may meet here
            if item.done:
                return None
            try:
                item.attempt()
            except Exception as e:  # noqa: BLE001 - logged, retried
                item.error = e
                item.tries += 1
                delay = min(self.first * 2 ** (item.tries - 1), self.most)
                if item.tries == 1 or delay >= self.most:
                    log.warning("docker: removing %s failed (try %d: %s); retrying in %.1fs", item.name,
                                item.tries, e, delay)
                with self._cond:
                    if not self._closed:
                        item.due = time.monotonic() + delay
                        self._ensure_thread()
                        self._cond.notify_all()
                return e
            item.done = True
        with self._cond:
            if self._items.get(item.key) is item:
                del self._items[item.key]
                self._cond.notify_all()  # the retry thread ends once nothing is left
        if item.tries:
            log.info("docker: removed %s after %d failed tries", item.name, item.tries)
        return None

    def _ensure_thread(self) -> None:  # with _cond held
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="execbox-docker-removals", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    soonest = min(self._items.values(), key=lambda i: i.due, default=None)
                    if soonest is None or soonest.due == float("inf"):
                        if not self._items:
                            self._thread = None
                            return
                        self._cond.wait()
                        continue
                    wait = soonest.due - time.monotonic()
                    if wait <= 0:
                        soonest.due = float("inf")
                        break
                    self._cond.wait(wait)
            self._try(soonest)

    def close(self) -> list[str]:
        """Stop retrying, after one last try of each (a failure is only logged: the next start's
        sweep of a dead process's leftovers covers it). Returns what stayed."""
        with self._cond:
            self._closed = True
            items = list(self._items.values())
            self._cond.notify_all()
        for item in items:
            self._try(item)
        left = self.pending()
        if left:
            log.warning("docker: %d containers could not be removed (the engine does not answer?); the next start "
                        "removes them and their host side", len(left))
        return left
