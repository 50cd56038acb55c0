"""Per-tenant concurrency counters (executions running, session requests in flight).

These bound what one process does at a time (worker threads, boxes busy), so they are counted
per replica in memory; session *quotas* are counted from the registry instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ...errors import RateLimitError


class TenantCounters:
    def __init__(self, on_reject: Callable[[str], None]) -> None:
        self.running: dict[str, int] = {}  # tenant -> executions running
        self.inflight: dict[str, int] = {}  # tenant -> session requests in flight (incl. queued)
        self._lock = threading.Lock()
        self._on_reject = on_reject

    @contextmanager
    def slot(self, counter: dict[str, int], tenant_id: str, limit: int, reason: str, label: str,
             what: str) -> Iterator[None]:
        """Count one against ``limit`` for the block; SB008 (429) when the tenant is at it."""
        with self._lock:
            current = counter.get(tenant_id, 0)
            if current >= limit:
                self._on_reject(label)
                raise RateLimitError(f"tenant {tenant_id!r} already has {current} {what} (limit {limit})",
                                     details={"reason": reason, "limit": limit, "tenant_id": tenant_id})
            counter[tenant_id] = current + 1
        try:
            yield
        finally:
            with self._lock:
                left = counter.get(tenant_id, 1) - 1
                if left:
                    counter[tenant_id] = left
                else:
                    counter.pop(tenant_id, None)
