"""Per-tenant concurrency counters (executions running, session requests in flight), and the
answer to a tenant at its session quota.

The counters bound what one process does at a time (worker threads, boxes busy), so they are
counted per replica in memory; session *quotas* are counted from the registry instead.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ...errors import RateLimitError
from .registry import HELD

if TYPE_CHECKING:
    from .manager import SessionManager

FREE_A_SLOT = ("end a session it no longer needs (POST /v1/sandbox/sessions/{tenant_id}/{session_id}/close, "
               "RemoteSandbox.close(), MCP close_session)")


def tenant_full(manager: SessionManager, err: RateLimitError, tenant_id: str) -> RateLimitError:
    """SB008 ``tenant_max_sessions`` saying how to free a slot, with a truthful ``retry_after``:
    the seconds until the tenant's first idle session is reaped (None, and no Retry-After header,
    when none will be: every session is in use)."""
    wait = next_slot_in(manager, tenant_id)
    limit = err.details.get("limit")
    when = (f", or retry in about {wait} s, when its first idle session expires" if wait is not None else
            "; none of its sessions is idle, so none expires by itself while they are used")
    out = RateLimitError(f"tenant {tenant_id!r} holds its maximum of {limit} sessions (SANDBOX_TENANT_MAX_SESSIONS): "
                         f"{FREE_A_SLOT}{when}", details={**err.details, "retry_after": wait})
    out.retry_after = wait  # type: ignore[attr-defined]  # read by the error handler (service/errors.py)
    return out


def next_slot_in(manager: SessionManager, tenant_id: str) -> int | None:
    """Whole seconds until one of the tenant's held sessions ends by itself: a running one idle
    for SANDBOX_IDLE_TIMEOUT (plus EXECBOX_PAUSED_RETENTION when idle sessions are paused, since a
    paused one still holds its slot), a paused or lost one at its ``expires_at``, then the next
    sweep. None when none will (all in use now)."""
    settings = manager.settings
    now, mono = time.time(), time.monotonic()
    with manager._lock:
        local = {k: s for k, s in manager._sessions.items() if k[0] == tenant_id}
    pause = settings.idle_action == "pause" and manager.registry.persistent
    ends: list[float] = []
    for rec in manager.registry.list(tenant_id):
        if rec.state not in HELD:
            continue
        s = local.get((rec.tenant_id, rec.session_id))
        state = s.state if s is not None else rec.state
        if state == "paused":
            expires = (s.expires_at if s is not None else None) or rec.expires_at
            if expires:
                ends.append(expires)
            continue
        if s is not None and s.busy:
            continue  # in use: its idle clock starts when the use ends
        idle_end = now + (s.last_used - mono) if s is not None else (rec.last_used or now)
        ends.append(idle_end + settings.idle_timeout + (settings.paused_retention if pause else 0.0))
    if not ends:
        return None
    return max(1, math.ceil(min(ends) - now + settings.sweep_every))


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
            counter[tenant_id] = self._below(counter, tenant_id, limit, reason, label, what) + 1
        try:
            yield
        finally:
            with self._lock:
                left = counter.get(tenant_id, 1) - 1
                if left:
                    counter[tenant_id] = left
                else:
                    counter.pop(tenant_id, None)

    def check(self, counter: dict[str, int], tenant_id: str, limit: int, reason: str, label: str,
              what: str) -> None:
        """SB008 as ``slot`` gives it when the tenant is at ``limit`` now; counts nothing."""
        with self._lock:
            self._below(counter, tenant_id, limit, reason, label, what)

    def _below(self, counter: dict[str, int], tenant_id: str, limit: int, reason: str, label: str,
               what: str) -> int:
        current = counter.get(tenant_id, 0)
        if current >= limit:
            self._on_reject(label)
            raise RateLimitError(f"tenant {tenant_id!r} already has {current} {what} (limit {limit})",
                                 details={"reason": reason, "limit": limit, "tenant_id": tenant_id})
        return current
