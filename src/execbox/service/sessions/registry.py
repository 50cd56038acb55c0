"""The session registry's record and contract, and the in-memory registry.

The registry is the one place that says which sessions exist, where their box is, which
replica owns them and in which state they are. The SQL registry (``store/sessions_repo.py``)
makes that survive restarts and shared by replicas; ``MemoryRegistry`` is the same contract
for a single process that keeps nothing (tests, ``bench_sessions.py``'s baseline).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ...errors import InstanceCreationError, RateLimitError

STATES = ("creating", "running", "paused", "closing", "closed", "lost")
HELD = ("creating", "running", "paused")
"""States that count against a tenant's session quota (a paused session still holds its disk)."""
ACTIVE = ("creating", "running")
"""States that count against the service-wide SANDBOX_MAX_SESSIONS (they hold CPU and memory)."""


@dataclass(frozen=True)
class SessionRecord:
    id: str
    tenant_id: str
    session_id: str
    state: str
    provider: str | None = None
    box_handle: dict[str, Any] = field(default_factory=dict)
    runtime: str | None = None
    network_policy: dict[str, Any] = field(default_factory=dict)
    owner: str | None = None
    lease_expires: float | None = None
    contexts_lost: bool = False
    created_at: float = 0.0
    last_used: float = 0.0
    expires_at: float | None = None

    def lease_live(self, now: float | None = None) -> bool:
        return self.owner is not None and (self.lease_expires or 0.0) > (time.time() if now is None else now)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "tenant_id": self.tenant_id, "session_id": self.session_id, "state": self.state,
                "provider": self.provider, "runtime": self.runtime, "owner": self.owner,
                "lease_expires": self.lease_expires, "contexts_lost": self.contexts_lost,
                "created_at": self.created_at, "last_used": self.last_used, "expires_at": self.expires_at,
                "box": dict(self.box_handle), "network_policy": dict(self.network_policy)}


def new_id() -> str:
    return "ses_" + uuid.uuid4().hex[:20]


def quota_error(tenant_id: str, held: int, active: int, tenant_limit: int, global_limit: int) -> Exception | None:
    """The SB error a create must fail with, given the counts the registry saw under its lock."""
    if active >= global_limit:
        return InstanceCreationError(
            f"the service holds its maximum of {global_limit} sessions; wait for idle sessions to be "
            "reaped or paused, or raise SANDBOX_MAX_SESSIONS",
            details={"reason": "max_sessions", "limit": global_limit, "active": active})
    if held >= tenant_limit:
        return RateLimitError(
            f"tenant {tenant_id!r} holds its maximum of {tenant_limit} sessions",
            details={"reason": "tenant_max_sessions", "limit": tenant_limit, "tenant_id": tenant_id})
    return None


class SessionRegistry(Protocol):
    """What the session manager needs from a registry (SQL or in-memory)."""

    persistent: bool

    def identity(self) -> str | None:
        """A stable id of this registry (None: nothing persists); persistent registries keep their
        workspaces under ``<workspaces dir>/<identity>``."""
        ...

    def get(self, tenant_id: str, session_id: str) -> SessionRecord | None: ...

    def list(self, tenant_id: str | None = None) -> list[SessionRecord]: ...

    def create(self, tenant_id: str, session_id: str, *, provider: str | None, runtime: str | None,
               owner: str, lease_ttl: float, tenant_limit: int, global_limit: int) -> tuple[SessionRecord, bool]:
        """Insert a ``creating`` row under a lock, counting quotas first; or return the row that
        exists (created=False)."""
        ...

    def update(self, tenant_id: str, session_id: str, **fields: Any) -> bool: ...

    def claim(self, tenant_id: str, session_id: str, owner: str, lease_ttl: float) -> SessionRecord | None:
        """Make ``owner`` the owner if the row is free (no owner, own, or lease expired)."""
        ...

    def hand_back(self, tenant_id: str, session_id: str, owner: str, to_owner: str | None,
                  lease_expires: float | None) -> bool:
        """Give a row ``owner`` holds to ``to_owner`` with ``lease_expires``; False (nothing
        written) when ``owner`` no longer holds it."""
        ...

    def delete(self, tenant_id: str, session_id: str, *, row_id: str | None = None, owner: str | None = None,
               state: str | None = None) -> bool:
        """Delete the row; with ``row_id``/``owner``/``state``, only while it still has them (one
        conditional statement: a destroy another replica took over, or a new session of the name,
        is never deleted by a late destroyer). Whether a row was deleted."""
        ...

    def adoptable(self, owner: str, lease_ttl: float, own_only: bool = False) -> list[SessionRecord]:
        """Claim every held row that is ``owner``'s or whose owner's lease expired (``own_only``:
        only ``owner``'s own rows); return them."""
        ...

    def heartbeat(self, owner: str, lease_ttl: float, last_used: dict[tuple[str, str], float],
                  url: str | None = None) -> set[tuple[str, str]]:
        """Renew ``owner``'s leases, store last-used times; return the keys it still owns."""
        ...

    def orphaned(self, owner: str, now: float, idle_before: float, limit: int) -> list[SessionRecord]:
        """At most ``limit`` ``creating``/``running`` rows another replica than ``owner`` owns,
        whose lease ran out by ``now`` and that were last used at or before ``idle_before``;
        the longest idle first. Only reads: the caller still ``claim``s each one."""
        ...

    def expired(self, now: float) -> list[SessionRecord]: ...

    def leave(self, owner: str) -> None:
        """A replica that drains: forget its heartbeat row and end its leases now (its sessions
        keep their owner, so a restart re-adopts them; any replica may take one over on use)."""
        ...

    def replicas(self) -> list[dict[str, Any]]: ...


class MemoryRegistry:
    """A process-local registry: nothing survives the process (the pre-registry behaviour)."""

    persistent = False

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], SessionRecord] = {}
        self._lock = threading.Lock()

    def identity(self) -> str | None:
        return None

    def get(self, tenant_id: str, session_id: str) -> SessionRecord | None:
        return self._rows.get((tenant_id, session_id))

    def list(self, tenant_id: str | None = None) -> list[SessionRecord]:
        with self._lock:
            rows = [r for r in self._rows.values() if tenant_id is None or r.tenant_id == tenant_id]
        return sorted(rows, key=lambda r: (r.tenant_id, r.session_id))

    def create(self, tenant_id: str, session_id: str, *, provider: str | None, runtime: str | None,
               owner: str, lease_ttl: float, tenant_limit: int, global_limit: int) -> tuple[SessionRecord, bool]:
        now = time.time()
        with self._lock:
            row = self._rows.get((tenant_id, session_id))
            if row is not None:
                return row, False
            held = sum(1 for r in self._rows.values() if r.tenant_id == tenant_id and r.state in HELD)
            active = sum(1 for r in self._rows.values() if r.state in ACTIVE)
            err = quota_error(tenant_id, held, active, tenant_limit, global_limit)
            if err is not None:
                raise err
            row = SessionRecord(new_id(), tenant_id, session_id, "creating", provider=provider, runtime=runtime,
                                owner=owner, lease_expires=now + lease_ttl, created_at=now, last_used=now)
            self._rows[(tenant_id, session_id)] = row
            return row, True

    def update(self, tenant_id: str, session_id: str, **fields: Any) -> bool:
        with self._lock:
            row = self._rows.get((tenant_id, session_id))
            if row is None:
                return False
            self._rows[(tenant_id, session_id)] = replace(row, **fields)
            return True

    def claim(self, tenant_id: str, session_id: str, owner: str, lease_ttl: float) -> SessionRecord | None:
        now = time.time()
        with self._lock:
            row = self._rows.get((tenant_id, session_id))
            if row is None or (row.owner not in (None, owner) and row.lease_live(now)):
                return None
            row = replace(row, owner=owner, lease_expires=now + lease_ttl)
            self._rows[(tenant_id, session_id)] = row
            return row

    def hand_back(self, tenant_id: str, session_id: str, owner: str, to_owner: str | None,
                  lease_expires: float | None) -> bool:
        with self._lock:
            row = self._rows.get((tenant_id, session_id))
            if row is None or row.owner != owner:
                return False
            self._rows[(tenant_id, session_id)] = replace(row, owner=to_owner, lease_expires=lease_expires)
            return True

    def delete(self, tenant_id: str, session_id: str, *, row_id: str | None = None, owner: str | None = None,
               state: str | None = None) -> bool:
        with self._lock:
            row = self._rows.get((tenant_id, session_id))
            if row is None or (row_id is not None and row.id != row_id) or \
                    (owner is not None and row.owner != owner) or (state is not None and row.state != state):
                return False
            del self._rows[(tenant_id, session_id)]
            return True

    def adoptable(self, owner: str, lease_ttl: float, own_only: bool = False) -> list[SessionRecord]:
        return []  # nothing outlives the process

    def heartbeat(self, owner: str, lease_ttl: float, last_used: dict[tuple[str, str], float],
                  url: str | None = None) -> set[tuple[str, str]]:
        now = time.time()
        with self._lock:
            for key, row in list(self._rows.items()):
                if row.owner == owner:
                    self._rows[key] = replace(row, lease_expires=now + lease_ttl,
                                              last_used=last_used.get(key, row.last_used))
            return {k for k, r in self._rows.items() if r.owner == owner}

    def orphaned(self, owner: str, now: float, idle_before: float, limit: int) -> list[SessionRecord]:
        with self._lock:
            rows = [r for r in self._rows.values() if r.state in ACTIVE and r.owner not in (None, owner)
                    and not r.lease_live(now) and (r.last_used or 0.0) <= idle_before]
        return sorted(rows, key=lambda r: (r.last_used, r.tenant_id, r.session_id))[:max(0, limit)]

    def expired(self, now: float) -> list[SessionRecord]:
        with self._lock:
            return [r for r in self._rows.values() if r.expires_at is not None and r.expires_at < now]

    def leave(self, owner: str) -> None:
        return None

    def replicas(self) -> list[dict[str, Any]]:
        return []
