"""The end of a replica's life: SIGTERM drain (new work refused, late runs cancelled so every
request gets its answer) and shutdown (boxes stopped or detached, sessions kept for the restart).

Mixed into SessionManager; apart from ``lifecycle.py``, which reasons about the sessions while
the replica runs.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .manager import SessionManager
    from .model import Session

log = logging.getLogger("execbox.service.sessions")

PARK_RECANCEL = 0.05
"""Seconds between cancels while a box being stopped still runs something."""


class DrainMixin:
    # -- shutdown / drain ---------------------------------------------------------------------
    def begin_drain(self: SessionManager) -> None:
        """On SIGTERM, before the HTTP server stops: refuse new work now, and cancel what still
        runs once drain_timeout has passed, so every in-flight request answers (its run reported
        cancelled) before the server's own deadline instead of being cut off with a bare 500."""
        if self._draining:
            return
        self._draining = True

        def cancel_late() -> None:
            deadline = time.monotonic() + self.settings.drain_timeout
            while time.monotonic() < deadline:
                with self._lock:
                    busy = [s for s in self._sessions.values() if s.busy] or list(self._oneshots)
                if not busy:
                    return
                time.sleep(0.05)
            with self._lock:
                for s in self._sessions.values():
                    if s.busy:
                        s.cancel_reason = s.cancel_reason or "draining"
                running = [(s.provider, s.instance_id) for s in self._sessions.values() if s.busy]
                running += [(prov, iid) for iid, prov in self._oneshots.items()]
            for prov, iid in running:
                if prov is not None and iid is not None:
                    try:
                        prov.cancel(iid)
                    except Exception:  # noqa: BLE001 - a box that is going anyway
                        pass

        threading.Thread(target=cancel_late, name="execbox-drain", daemon=True).start()

    def shutdown(self: SessionManager) -> None:
        """Drain: refuse new work, let in-flight requests finish up to drain_timeout (then cancel
        them), stop this replica's boxes. With a persistent registry sessions survive (workspaces
        kept, Docker containers left running for the next start to re-attach); without one every
        session and its workspace is destroyed. The leases end at the last (``registry.leave``):
        any replica may take a session over on its next use, and a restart re-adopts the rest."""
        self._draining = True
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []
        deadline = time.monotonic() + self.settings.drain_timeout
        while time.monotonic() < deadline:
            with self._lock:
                busy = any(s.busy for s in self._sessions.values()) or bool(self._oneshots)
            if not busy:
                break
            time.sleep(0.05)
        keep = self.registry.persistent
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
            oneshots = list(self._oneshots.items())
            for s in sessions:
                s.closed = True
                s.cancel_reason = s.cancel_reason or "draining"
        for s in sessions:
            if keep:
                self._park(s)
            else:
                self._stop_and_teardown(s)
                self.registry.delete(s.tenant_id, s.session_id)
        for instance_id, prov in oneshots:
            self._destroy_instance(prov, instance_id)
        if keep:
            try:
                self.heartbeat()
                self.registry.leave(self.replica)
            except Exception:  # noqa: BLE001
                log.exception("final heartbeat failed")

    def _park(self: SessionManager, s: Session) -> None:
        """Stop a session's box without destroying the session (shutdown, fence). What runs is
        cancelled until the session is ours: a run that began after the first cancel (its
        request already held the session) is cancelled too, not left to run its full time."""
        while not s.lock.acquire(timeout=PARK_RECANCEL):
            prov, iid = s.provider, s.instance_id
            if prov is not None and iid is not None:
                try:
                    prov.cancel(iid)
                except Exception:  # noqa: BLE001 - a box that is going anyway
                    pass
        try:
            prov, iid = s.provider, s.instance_id
            if prov is None or iid is None:
                return
            detach = getattr(prov, "detach_instance", None)
            if detach is not None and detach(iid):
                return  # left running; the box handle in the registry finds it again
            self._destroy_instance(prov, iid)
            s.instance_id = None
        finally:
            s.lock.release()
