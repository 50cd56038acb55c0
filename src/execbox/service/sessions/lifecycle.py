"""What happens to sessions around a box's life: restart re-adoption, pause/resume, idle
reaping (a dead replica's too), paused-session expiry and the ownership heartbeat.

Mixed into SessionManager (it uses the manager's maps, lock and registry); kept apart because
it is the part that reasons about *other* processes: the previous run of this replica, dead
replicas, the registry's leases.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from ...errors import SessionNotFoundError
from .fence import CHECK_EVERY, HEARTBEAT_EVERY
from .fence import now as fence_now
from .model import box_ref
from .registry import SessionRecord
from .workspace import check_name, mounted, remove_workspace, workspace_dirs

if TYPE_CHECKING:
    from .manager import SessionManager
    from .model import Session

log = logging.getLogger("execbox.service.sessions")


REAP_RETRY = 300.0
"""Seconds before a dead replica's session whose reap failed is tried again (by this replica)."""


class LifecycleMixin:
    orphan_batch = 100
    """Most dead replicas' sessions one sweep of ``reap_orphaned`` reads and reaps."""
    _reap_failed: dict[tuple[str, str], float]  # reaps that failed -> when to try again (time.time())

    # -- restart: re-adoption -----------------------------------------------------------------
    def adopt_record(self: SessionManager, rec: SessionRecord) -> Session | None:
        """A local Session for a registry row this replica now owns; None (and the row ``lost``)
        when its workspace is gone. A box still running (a Docker container, a pod) is re-attached with
        its contexts; otherwise the box restarts lazily and ``contexts_lost`` says so."""
        from .model import Session

        path = self.record_workspace(rec)
        had_box = bool(rec.box_handle.get("instance_id"))
        if had_box and rec.box_handle.get("workspace") and not os.path.isdir(path):
            self.registry.update(rec.tenant_id, rec.session_id, state="lost",
                                 expires_at=time.time() + self.settings.paused_retention)
            log.warning("session %s/%s is lost: workspace %s is gone", rec.tenant_id, rec.session_id, path)
            return None
        state = rec.state if rec.state in ("running", "paused") else "running"
        s = Session(rec.tenant_id, rec.session_id, path, created_at=rec.created_at, state=state,
                    contexts_lost=rec.contexts_lost, expires_at=rec.expires_at, runtime=rec.runtime)
        if state == "running" and box_ref(rec.box_handle):
            if self._current_or_none() is None:  # provider still starting: re-attach on first use
                s.pending_handle = rec
                return s
            self._reattach(s, rec)
        if s.instance_id is None and s.pending_handle is None and had_box and state == "running":
            s.contexts_lost = True
            self.registry.update(rec.tenant_id, rec.session_id, contexts_lost=True,
                                 box_handle={"workspace": rec.box_handle.get("workspace")})
        return s

    def _drop_abandoned_creation(self: SessionManager, rec: SessionRecord) -> None:
        """A session whose first box never started (the service stopped in its first request,
        which got no answer): ended as a failed creation is, row and empty workspace removed,
        rather than kept as a session nobody was told of that holds one of the tenant's slots."""
        log.info("session %s/%s: its creation was cut off before its first box started; removing it",
                 rec.tenant_id, rec.session_id)
        self.registry.delete(rec.tenant_id, rec.session_id)
        path = self.record_workspace(rec)
        if os.path.isdir(path) and not mounted(path):
            remove_workspace(path)

    def adopt_all(self: SessionManager, own_only: bool = False) -> list[tuple[str, str]]:
        """At start: take over our own rows and those of replicas whose lease expired; remove
        workspaces no row knows about. Returns the keys adopted. ``own_only`` (after a fence):
        our own rows only; after a database outage every lease has run out, and the others'
        rows are their owners' again at their next heartbeat (or taken over on use)."""
        adopted: list[tuple[str, str]] = []
        if not self.registry.persistent:
            return adopted
        for rec in self.registry.adoptable(self.replica, self.settings.lease_ttl, own_only=own_only):
            key = (rec.tenant_id, rec.session_id)
            with self._lock:
                if key in self._sessions:
                    continue
            if rec.state == "creating" and not rec.box_handle.get("instance_id"):
                self._drop_abandoned_creation(rec)
                continue
            s = self.adopt_record(rec)
            if s is not None:
                with self._lock:
                    self._sessions.setdefault(key, s)
                adopted.append(key)
        on_disk = workspace_dirs(self.workspaces_root)  # before reading the rows: a row always
        known = {(r.tenant_id, r.session_id) for r in self.registry.list()}  # precedes its directory
        for tenant, session, path in on_disk:
            if (tenant, session) in known:
                continue
            if mounted(path):  # a live box (possibly another service's on a shared root) uses it
                log.warning("leaving workspace %s: no session in the registry, but it is mounted", path)
                continue
            log.info("removing workspace %s: no session in the registry", path)
            remove_workspace(path)
        self.remove_orphan_boxes()  # boxes.py
        return adopted

    def _current_or_none(self: SessionManager) -> Any:
        try:
            return self.providers.current()
        except Exception:  # noqa: BLE001
            return None

    def _box_ids(self: SessionManager) -> set[str]:
        """Box ids (containers, pods) the registry still refers to (any replica's)."""
        return {ref for r in self.registry.list() if (ref := box_ref(r.box_handle))}

    # -- pause / resume ---------------------------------------------------------------------
    def pause(self: SessionManager, tenant_id: str, session_id: str) -> dict[str, Any]:
        """Stop the session's box (CPU and memory freed), keep its workspace, start its retention."""
        check_name(tenant_id, "tenant_id")
        check_name(session_id, "session_id")
        self._refuse_if_draining()
        if self.get(tenant_id, session_id) is None and self.registry.get(tenant_id, session_id) is None:
            raise SessionNotFoundError(f"no session {tenant_id}/{session_id}",
                                       details={"tenant_id": tenant_id, "session_id": session_id})
        with self._held(tenant_id, session_id) as s:
            self._pause_locked(s)
            return self.session_out(s)

    def _pause_locked(self: SessionManager, s: Session) -> None:
        if s.state == "creating":
            raise SessionNotFoundError(f"no session {s.tenant_id}/{s.session_id}",
                                       details={"tenant_id": s.tenant_id, "session_id": s.session_id})
        if s.provider is not None and s.instance_id is not None:
            self._destroy_instance(s.provider, s.instance_id)
            s.instance_id = None
            s.contexts_lost = True
        elif s.pending_handle is not None:  # not re-attached yet: its box goes by the row's handle
            self._remove_pending_box(s)
            s.contexts_lost = True
        s.state = "paused"
        s.expires_at = time.time() + self.settings.paused_retention
        self.registry.update(s.tenant_id, s.session_id, state="paused", expires_at=s.expires_at,
                             contexts_lost=s.contexts_lost, box_handle={"workspace": s.workspace})

    def resume(self: SessionManager, tenant_id: str, session_id: str, template: str = "python") -> dict[str, Any]:
        """Bring a paused session back under the same id (its box starts now)."""
        with self.session(tenant_id, session_id, template) as s:
            return self.session_out(s)

    def _mark_running(self: SessionManager, s: Session) -> None:
        s.state, s.expires_at = "running", None
        self.registry.update(s.tenant_id, s.session_id, state="running", expires_at=None)

    # -- idle reaping, expiry, heartbeat ----------------------------------------------------------
    def reap_idle(self: SessionManager) -> list[tuple[str, str]]:
        """Sessions unused for longer than idle_timeout: destroyed, or paused when
        SANDBOX_IDLE_ACTION=pause. Returns their keys."""
        cutoff = time.monotonic() - self.settings.idle_timeout
        pause = self.settings.idle_action == "pause" and self.registry.persistent
        with self._lock:
            idle = [s for s in self._sessions.values()
                    if s.busy == 0 and s.last_used < cutoff and not (pause and s.state == "paused")]
        idle = self._let_go_of_taken_over(idle)
        with self._lock:
            idle = [s for s in idle if s.busy == 0 and s.last_used < cutoff and self._sessions.get(
                (s.tenant_id, s.session_id)) is s]
            if not pause:
                for s in idle:
                    del self._sessions[(s.tenant_id, s.session_id)]
                    self._dirty.pop((s.tenant_id, s.session_id), None)
                    s.closed = True
        for s in idle:
            log.info("idle session", extra={"fields": {
                "tenant_id": s.tenant_id, "session_id": s.session_id, "instance_id": s.instance_id,
                "operation": "pause_idle" if pause else "reap_idle"}})
            if pause:
                try:
                    with s.lock:
                        if not s.closed and s.busy == 0:
                            self._pause_locked(s)
                except Exception:  # noqa: BLE001 - pause the others; this one is tried at the next sweep
                    log.exception("pausing idle session %s/%s failed", s.tenant_id, s.session_id)
                    continue
            else:
                try:
                    self._close(s)
                except Exception:  # noqa: BLE001 - reap the others; its row stays closing for a later sweep
                    log.exception("reaping idle session %s/%s failed", s.tenant_id, s.session_id)
                    continue
                self.ended.record(s.tenant_id, s.session_id, "idle_timeout")
            if self.metrics is not None:
                self.metrics.sessions_reaped.inc()
        return [(s.tenant_id, s.session_id) for s in idle]

    def _let_go_of_taken_over(self: SessionManager, idle: list[Session]) -> list[Session]:
        """The idle sessions this replica still owns (its lease renewed). One another replica took
        over while this one could not renew (cut off from the database, frozen) is dropped here
        with its box, and its workspace and row are left to the new owner: reaping it as ours
        would delete the files the owner is using. A registry that does not answer reaps nothing."""
        if not self.registry.persistent or not idle:
            return idle
        mine: list[Session] = []
        for s in idle:
            if self.registry.claim(s.tenant_id, s.session_id, self.replica, self.settings.lease_ttl) is not None:
                mine.append(s)
                continue
            with self._lock:
                if self._sessions.get((s.tenant_id, s.session_id)) is not s or s.busy:
                    continue
                del self._sessions[(s.tenant_id, s.session_id)]
                self._dirty.pop((s.tenant_id, s.session_id), None)
                s.closed = True
            self._let_go(s)
        return mine

    def _let_go(self: SessionManager, s: Session) -> None:
        """Stop this replica's box of a session another replica owns now (a container stays for
        its new owner); the workspace and the row are the owner's."""
        log.warning("session %s/%s is owned by another replica now; stopping its box here",
                    s.tenant_id, s.session_id)
        with s.lock:
            detach = getattr(s.provider, "detach_instance", None)
            if s.provider is not None and s.instance_id is not None:
                if detach is None or not detach(s.instance_id):
                    self._destroy_instance(s.provider, s.instance_id)
                s.instance_id = None

    def reap_orphaned(self: SessionManager) -> list[tuple[str, str]]:
        """Idle sessions of replicas that died: their lease ran out and nobody used (so adopted)
        them, yet they still count against the tenant's and the cluster's session limits. Any
        replica's sweep claims such a row (one wins: ``claim`` is conditional) and treats it like
        its own idle session: destroyed, or paused with SANDBOX_IDLE_ACTION=pause.

        The registry selects the candidates (``orphaned``: a filtered query, not the whole table
        on every sweep of every replica), at most ``orphan_batch`` of them, the longest idle
        first; the next sweep takes the rest (a reaped row is gone or paused, a claimed one is
        owned by a live replica: neither is selected again)."""
        if not self.registry.persistent:
            return []
        now = time.time()
        cutoff = now - self.settings.idle_timeout
        pause = self.settings.idle_action == "pause"
        done: list[tuple[str, str]] = []
        failed = self._reap_failed
        for key, retry_at in list(failed.items()):
            if retry_at <= now:
                del failed[key]
        for rec in self.registry.orphaned(self.replica, now, cutoff, self.orphan_batch + len(failed)):
            key = (rec.tenant_id, rec.session_id)
            if key in failed:
                continue  # a row whose reap failed waits its turn: it would head every batch
            with self._lock:
                if key in self._sessions:
                    continue
            if self.registry.claim(rec.tenant_id, rec.session_id, self.replica, self.settings.lease_ttl) is None:
                continue  # another replica took it (or its owner came back) meanwhile
            log.info("idle session of a dead replica", extra={"fields": {
                "tenant_id": rec.tenant_id, "session_id": rec.session_id, "owner": rec.owner,
                "operation": "pause_idle" if pause else "reap_idle"}})
            try:
                if pause:
                    remover = getattr(self._current_or_none(), "remove_box", None)
                    if remover is not None and box_ref(rec.box_handle):
                        remover(rec.box_handle)
                    self.registry.update(rec.tenant_id, rec.session_id, state="paused", contexts_lost=True,
                                         expires_at=now + self.settings.paused_retention,
                                         box_handle={"workspace": rec.box_handle.get("workspace")})
                else:
                    self.destroy_unloaded(rec.tenant_id, rec.session_id)
                    self.ended.record(rec.tenant_id, rec.session_id, "idle_timeout")
            except Exception:  # noqa: BLE001 - keep sweeping the others
                log.exception("reaping %s/%s of dead replica %s failed", rec.tenant_id, rec.session_id, rec.owner)
                failed[key] = time.time() + REAP_RETRY
                # handed back as it was found: claimed, this replica's heartbeat would renew its
                # lease for ever without any sweep (ours or another's) trying it again; unless a
                # request made it this replica's meanwhile (then it is served here, not orphaned)
                with self._lock:
                    served = key in self._sessions
                if not served:
                    try:
                        self.registry.hand_back(rec.tenant_id, rec.session_id, self.replica, rec.owner,
                                                rec.lease_expires)
                    except Exception:  # noqa: BLE001 - the heartbeat keeps it ours; retried after a restart
                        log.exception("handing %s/%s back failed", rec.tenant_id, rec.session_id)
                continue
            done.append(key)
            if self.metrics is not None:
                self.metrics.sessions_reaped.inc()
        return done

    def expire(self: SessionManager) -> list[tuple[str, str]]:
        """Delete paused (and lost) sessions whose retention ran out, box and workspace included;
        finish the destroys cut off (``closing`` rows a lease past their start whose destroyer
        is gone: admin.py)."""
        done: list[tuple[str, str]] = []
        expired = self.registry.expired(time.time())
        done += self.finish_abandoned([rec for rec in expired if rec.state == "closing"])
        for rec in expired:
            if rec.state not in ("paused", "lost"):
                continue
            if rec.owner not in (None, self.replica) and rec.lease_live() and rec.state != "lost":
                continue  # its owner expires it
            try:
                self.destroy(rec.tenant_id, rec.session_id, "retention_expired")
                done.append((rec.tenant_id, rec.session_id))
            except SessionNotFoundError:
                pass
            except Exception:  # noqa: BLE001 - owned elsewhere meanwhile, or a teardown failure
                log.exception("expiring %s/%s failed", rec.tenant_id, rec.session_id)
        return done

    def heartbeat(self: SessionManager) -> None:
        """Renew this replica's leases and flush last-used times (one short transaction)."""
        with self._lock:
            dirty, self._dirty = self._dirty, {}
        began = fence_now()  # the leases it writes run from (at least) here
        owned = self.registry.heartbeat(self.replica, self.settings.lease_ttl, dirty,
                                        self.settings.replica_url or None)
        self.renewed(began)
        if not self.registry.persistent:
            return
        with self._lock:  # taken over while this replica could not renew its lease: let go
            lost = [s for k, s in self._sessions.items() if k not in owned and s.busy == 0 and s.state != "creating"]
            for s in lost:
                del self._sessions[(s.tenant_id, s.session_id)]
                s.closed = True
        for s in lost:
            self._let_go(s)

    def start(self: SessionManager) -> None:
        if self._threads:
            return
        self._stop.clear()
        self._draining = False
        try:
            self.heartbeat()
            adopted = self.adopt_all()
            if adopted:
                log.info("re-adopted %d sessions", len(adopted))
            if self.registry.persistent:  # destroys a kill cut off (admin.py); here, not in adopt_all:
                finished = self.finish_abandoned(self.registry.list())  # a fenced replica's heartbeat
                if finished:  # thread re-adopts, and must not wait on a workspace removal
                    log.info("finished %d session destroys that were cut off", len(finished))
            self.heartbeat()  # the leases run from now, not from before a long adoption
        except Exception:  # noqa: BLE001 - a registry hiccup must not stop the service starting
            log.exception("re-adopting sessions failed")
        ttl = self.settings.lease_ttl
        loops = [(self._sweep, self.settings.sweep_every, "execbox-reaper"),
                 (self.heartbeat, max(0.2, ttl * HEARTBEAT_EVERY), "execbox-heartbeat")]
        if self.fences():  # its own thread: a heartbeat hung on a dead connection must not delay it
            loops.append((self.fence_if_cut_off, max(0.1, ttl * CHECK_EVERY), "execbox-fence"))
        for target, every, name in loops:
            t = threading.Thread(target=self._loop, args=(target, every), name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _sweep(self: SessionManager) -> None:
        self.reap_idle()
        self.reap_orphaned()
        self.expire()
        self.remove_orphan_boxes(periodic=True)

    def _loop(self: SessionManager, fn: Any, every: float) -> None:
        """``fn`` every ``every`` s, start to start: a slow call does not push the next one back
        (a heartbeat must renew on time), nor do calls pile up (one at a time)."""
        due = time.monotonic() + every
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            due = max(due + every, time.monotonic())
            try:
                fn()
            except Exception:  # noqa: BLE001 - keep sweeping
                log.exception("%s failed", getattr(fn, "__name__", fn))
