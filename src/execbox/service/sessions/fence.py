"""Self-fencing: a replica that cannot renew its leases stops its boxes before another replica
may take its sessions over.

A lease is written as ``now + lease_ttl`` on every heartbeat (every ``lease_ttl / 3``). Once it
has run out, any replica may take a session over: re-attach its Docker container, or start a new
box on its workspace. If the old owner is alive but cut off from the database (a network
partition, a frozen VM that wakes up), its box would still be running, busy runs included. On one
host the jail refuses the takeover while the old bind is mounted (``quota.StillMounted``), but
replicas on several hosts share the workspaces over network storage, where two kernels would then
mount one ext4 image. So a replica whose last renewal is older than half a lease stops every box
it holds (runs are cancelled; Docker containers are left for the new owner, as at shutdown), well
before the lease it last wrote runs out, whatever the hung database call is doing meanwhile.

Only a replica set fences (``EXECBOX_REPLICA_URL`` set, a persistent registry): a single service
has nobody to hand its sessions to, and a database hiccup must not cost it its boxes.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .manager import SessionManager

log = logging.getLogger("execbox.service.sessions")

FENCE_AFTER = 0.5
"""Fraction of ``lease_ttl`` without a renewal after which this replica stops its boxes."""


def now() -> tuple[float, float]:
    """(monotonic, wall) time: leases are judged by wall clocks (``lease_expires``), and a VM that
    was paused may find its monotonic clock did not move while the wall clock (once resynced) did."""
    return time.monotonic(), time.time()


class FenceMixin:
    _renewed_at: tuple[float, float] = (0.0, 0.0)  # now() when the last successful heartbeat began

    def fences(self: SessionManager) -> bool:
        return bool(self.settings.replica_url) and self.registry.persistent

    def unrenewed_for(self: SessionManager) -> float:
        mono, wall = now()
        return max(mono - self._renewed_at[0], wall - self._renewed_at[1])

    def fence_if_cut_off(self: SessionManager) -> int:
        """Stop every box of this replica when its leases may be running out unrenewed; the
        number of sessions let go (0: renewed recently, nothing held, or not a replica set)."""
        if not self.fences() or self.unrenewed_for() <= self.settings.lease_ttl * FENCE_AFTER:
            return 0
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
            self._dirty.clear()
            for s in sessions:
                s.closed = True
        if sessions:
            log.error("replica %s has not renewed its session leases for %.1fs (lease %.0fs): stopping the boxes "
                      "of its %d sessions before another replica may take them over", self.replica,
                      self.unrenewed_for(), self.settings.lease_ttl, len(sessions))
            for s in sessions:  # _park cancels a busy run first, then waits for it to end
                threading.Thread(target=self._park, args=(s,), name="execbox-fence", daemon=True).start()
            if self.metrics is not None:
                self.metrics.sessions_fenced.inc(len(sessions))
        return len(sessions)
