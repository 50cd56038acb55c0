"""Self-fencing: a replica that cannot renew its leases stops its boxes before another replica
may take its sessions over.

A lease is written as ``now + lease_ttl`` on every heartbeat (every ``lease_ttl / 4``, start to
start). Once it has run out, any replica may take a session over: re-attach its Docker container,
or start a new box on its workspace. If the old owner is alive but cut off from the database (a
network partition, a frozen VM that wakes up), its box would still be running, busy runs
included. On one host the jail refuses the takeover while the old bind is mounted
(``quota.StillMounted``), but replicas on several hosts share the workspaces over network storage,
where two kernels would then mount one ext4 image.

So when the lease this replica last wrote has less than ``FENCE_MARGIN`` of its time left, judged
by the monotonic and the wall clock both (a VM that was paused may find only the wall clock
moved), the replica is *fenced*, as if it restarted: it lets go of its sessions, cancels their
runs and stops their boxes (Docker containers are left for whoever owns the session next, as at
shutdown), and takes no session request until a heartbeat succeeds again (503 SB009 meanwhile).
That heartbeat then re-adopts the sessions it still owns (``owner`` = this replica only: after a
database outage every lease has run out, and the other replicas' rows are theirs), as a restart does (containers
re-attached, jail boxes restarted on next use, idle reaping as usual); those another replica
took are that replica's. A watchdog thread of its own checks this, whatever a hung database call
is doing.

Only a replica set fences (``EXECBOX_REPLICA_URL`` set, a persistent registry): a single service
has nobody to hand its sessions to, and a database hiccup must not cost it its boxes.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from ...errors import InvalidConfigError, ProviderUnavailableError

if TYPE_CHECKING:
    from .manager import SessionManager

log = logging.getLogger("execbox.service.sessions")

FENCE_MARGIN = 1 / 3
"""Fraction of ``lease_ttl`` still left on the last lease written at which this replica fences.
A healthy replica renews every quarter lease, so it fences only if a heartbeat hangs for more
than ~5/12 of a lease (over 6 s at the default 15 s: longer than the database connect timeout)."""
HEARTBEAT_EVERY = 1 / 4
"""Heartbeats per lease: start to start, so a slow one does not push the next back."""
CHECK_EVERY = 1 / 15
"""How often (fraction of ``lease_ttl``) the watchdog looks."""


def now() -> tuple[float, float]:
    """(monotonic, wall) time: leases are judged by wall clocks (``lease_expires``), and a VM that
    was paused may find its monotonic clock did not move while the wall clock (once resynced) did."""
    return time.monotonic(), time.time()


class FenceMixin:
    _lease_until: tuple[float, float] = (0.0, 0.0)  # (monotonic, wall) end of the lease last written
    _fenced = False

    def fences(self: SessionManager) -> bool:
        return bool(self.settings.replica_url) and self.registry.persistent

    def fenced(self: SessionManager) -> bool:
        """Fenced now: serving no session until a heartbeat renews the leases (/readyz says 503)."""
        return self._fenced

    def lease_left(self: SessionManager) -> float:
        mono, wall = now()
        return min(self._lease_until[0] - mono, self._lease_until[1] - wall)

    def refuse_duplicate_id(self: SessionManager) -> None:
        """At start, before this process writes anything: SB002 when another live process already
        heartbeats under this replica's id (a duplicated EXECBOX_REPLICA_ID would re-adopt, and
        serve, a live replica's sessions). A row with a fresh heartbeat may also be this replica's
        previous process, killed moments ago: its heartbeat is watched for two heartbeat periods,
        and only one that moves (or a URL that changes) is another live process."""
        if not self.registry.persistent:
            return
        ttl = self.settings.lease_ttl
        seen = _replica_row(self)
        if seen is None or time.time() - float(seen.get("heartbeat") or 0.0) > ttl:
            return  # none, or stale: the process that wrote it is gone
        deadline = time.monotonic() + ttl * HEARTBEAT_EVERY * 2 + 0.5
        while time.monotonic() < deadline:
            time.sleep(max(0.05, ttl * CHECK_EVERY))
            row = _replica_row(self)
            if row is None:
                return  # it drained and left
            if row.get("heartbeat") != seen.get("heartbeat") or row.get("url") != seen.get("url"):
                raise InvalidConfigError(
                    f"EXECBOX_REPLICA_ID {self.replica!r} is in use by a live replica (url {row.get('url')}, "
                    "heartbeating now): every replica needs its own id; set a distinct EXECBOX_REPLICA_ID",
                    details={"field": "EXECBOX_REPLICA_ID", "replica": self.replica, "live_url": row.get("url")})

    def renewed(self: SessionManager, began: tuple[float, float]) -> None:
        """A heartbeat that began at ``began`` wrote its leases: they run until ``began + ttl``.
        The first after a fence re-adopts the sessions this replica still owns."""
        ttl = self.settings.lease_ttl
        self._lease_until = (began[0] + ttl, began[1] + ttl)
        if self._fenced:
            adopted = self.adopt_all(own_only=True)  # not the rows of replicas fenced as we were
            self._fenced = False
            log.warning("replica %s renewed its session leases again; re-adopted %d sessions", self.replica,
                        len(adopted))

    def _refuse_if_fenced(self: SessionManager) -> None:
        if self._fenced:
            raise ProviderUnavailableError(
                f"replica {self.replica} cannot reach the session registry; it serves no session until it can (retry)",
                details={"reason": "fenced", "replica": self.replica})

    def fence_if_cut_off(self: SessionManager) -> int:
        """Fence when the last lease written is nearly over: let go of every session of this
        replica and stop its box (the number let go now; 0 when renewed recently, nothing held,
        already fenced, or not a replica set)."""
        if not self.fences() or self.lease_left() > self.settings.lease_ttl * FENCE_MARGIN:
            return 0
        with self._lock:
            first, self._fenced = not self._fenced, True
            sessions = list(self._sessions.values())
            self._sessions.clear()
            self._dirty.clear()
            for s in sessions:
                s.closed = True
                s.cancel_reason = "fenced"
        if first:
            log.error("replica %s could not renew its session leases (%.1fs left of %.0fs): letting go of its %d "
                      "sessions, cancelling their runs and stopping their boxes before another replica may take them "
                      "over", self.replica, max(0.0, self.lease_left()), self.settings.lease_ttl, len(sessions))
        for s in sessions:  # _park cancels what runs until it holds the session, then stops its box
            threading.Thread(target=self._park, args=(s,), name="execbox-fence", daemon=True).start()
        if sessions and self.metrics is not None:
            self.metrics.sessions_fenced.inc(len(sessions))
        return len(sessions)


def _replica_row(sessions: SessionManager) -> dict | None:
    return next((r for r in sessions.registry.replicas() if r["id"] == sessions.replica), None)
