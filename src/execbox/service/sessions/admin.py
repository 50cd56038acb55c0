"""Looking at and destroying sessions: the registry-wide list, one session's state, destroy.

Mixed into SessionManager; apart from the hot path (``manager.py``) because it reads the
registry for *every* replica's sessions and tears boxes and workspaces down.

A destroy writes the row ``closing`` first, tears the box and the workspace down, and deletes
the row last, so a destroy cut off (``kill -9``, a crash, a failed teardown) leaves a row that
says what was under way. Such a row is finished (``finish_closing``) once its destroyer is
gone: by this replica at its next start or sweep when it was this replica's own (no destroy of
it runs in this process), by any replica once the replica that wrote it has not heartbeaten for
a lease. A row whose destroyer is alive is left to it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ...errors import ProviderUnavailableError, SandboxError, SessionNotFoundError
from .model import box_ref
from .workspace import check_name, mounted, remove_workspace

if TYPE_CHECKING:
    from .manager import SessionManager
    from .model import Session
    from .registry import SessionRecord

log = logging.getLogger("execbox.service.sessions")

FINISH_RETRY = 300.0
"""Seconds before the sweep tries again to finish a ``closing`` row whose teardown failed."""


def record_out(rec: SessionRecord) -> dict[str, Any]:
    """A registry row as the API shows a session (``SessionOut``); the live counters are the
    owning replica's, so they are empty here."""
    return {"tenant_id": rec.tenant_id, "session_id": rec.session_id, "state": rec.state, "owner": rec.owner,
            "provider": rec.provider, "instance_id": rec.box_handle.get("instance_id"),
            "created_at": rec.created_at, "last_used": rec.last_used, "expires_at": rec.expires_at,
            "lease_expires": rec.lease_expires, "contexts_lost": rec.contexts_lost, "busy": False,
            "runtime": rec.runtime}


class AdminMixin:
    # -- admin ------------------------------------------------------------------------------
    def list(self: SessionManager, tenant_id: str | None = None) -> list[dict[str, Any]]:
        """Every session in the registry (all replicas'), with this replica's live details."""
        with self._lock:
            local = {k: s for k, s in self._sessions.items() if tenant_id is None or k[0] == tenant_id}
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for rec in self.registry.list(tenant_id):
            key = (rec.tenant_id, rec.session_id)
            row = record_out(rec)
            if key in local:
                row.update(self.session_out(local[key]))
            else:
                self._fill_expiry(row, None)
            out[key] = row
        for key, s in local.items():
            out.setdefault(key, self.session_out(s))
        return [out[k] for k in sorted(out)]

    def session_out(self: SessionManager, s: Session) -> dict[str, Any]:
        """A session held here as the API shows it (``SessionOut``), its expiry filled in."""
        row = s.to_dict(self.replica)
        self._fill_expiry(row, s)
        return row

    def _fill_expiry(self: SessionManager, row: dict[str, Any], s: Session | None) -> None:
        """``expires_at`` of a running (or creating) session: when the idle reaper takes it if it
        stays unused, last use + SANDBOX_IDLE_TIMEOUT (what happens then: SANDBOX_IDLE_ACTION).
        A session in use now is at least that far off (its idle clock starts when the use ends).
        Paused, lost and closing sessions keep the registry's ``expires_at``."""
        if row.get("state") not in ("creating", "running") or row.get("expires_at") is not None:
            return
        idle = self.settings.idle_timeout
        now = time.time()
        if s is None:
            row["expires_at"] = (row.get("last_used") or now) + idle
        elif s.busy:
            row["expires_at"] = now + idle
        else:
            row["expires_at"] = now + (s.last_used - time.monotonic()) + idle

    def info(self: SessionManager, tenant_id: str, session_id: str) -> dict[str, Any]:
        """One session's state, owner and expiry (SB002/404 when the registry has no such session)."""
        check_name(tenant_id, "tenant_id")
        check_name(session_id, "session_id")
        for row in self.list(tenant_id):
            if row["session_id"] == session_id:
                return row
        raise SessionNotFoundError(f"no session {tenant_id}/{session_id}",
                                   details={"tenant_id": tenant_id, "session_id": session_id})

    def count(self: SessionManager) -> int:
        return len(self._sessions)

    def loaded_sessions(self: SessionManager, prefix: str = "") -> list[tuple[str, str, float]]:
        """(tenant, session id, created_at) of the sessions loaded on this replica whose id starts
        with ``prefix`` and that nothing holds now (no database read)."""
        with self._lock:
            return [(t, sid, s.created_at) for (t, sid), s in self._sessions.items()
                    if sid.startswith(prefix) and not s.closed and s.busy == 0]

    def get(self: SessionManager, tenant_id: str, session_id: str) -> Session | None:
        return self._sessions.get((tenant_id, session_id))

    @contextmanager
    def if_running(self: SessionManager, tenant_id: str, session_id: str) -> Iterator[Session | None]:
        """The session, held exclusively as by ``session()``, when it is loaded on this replica and
        its box is running; else None. Unlike ``session()`` it never resumes a paused session,
        starts a box, creates or takes over a session, and it leaves the idle clock alone: for
        looking into workspaces (MCP's resources/list), not for using them."""
        check_name(tenant_id, "tenant_id")
        check_name(session_id, "session_id")
        with self._counters.slot(self._inflight, tenant_id, self.settings.tenant_max_requests,
                                 "tenant_max_requests", "requests", "session requests in flight"):
            with self._lock:
                s = self._sessions.get((tenant_id, session_id))
                if s is None or self._draining or not _box_running(s):
                    s = None
                else:
                    s.busy += 1  # not _touch: a look is not a use
            if s is None:
                yield None
                return
            try:
                with s.lock:
                    yield s if _box_running(s) else None
            finally:
                with self._lock:
                    s.busy -= 1

    def destroy(self: SessionManager, tenant_id: str, session_id: str, why: str = "destroyed") -> dict[str, Any]:
        """Stop whatever runs in the session, destroy its box and delete its workspace. ``why``
        (ended.REASONS) is remembered, so a new session under the name can say what became of this one."""
        check_name(tenant_id, "tenant_id")
        check_name(session_id, "session_id")
        with self._lock:
            s = self._sessions.pop((tenant_id, session_id), None)
            self._dirty.pop((tenant_id, session_id), None)
            if s is not None:
                s.closed = True
        if s is None:
            return self.destroy_unloaded(tenant_id, session_id, why)
        info = {**s.to_dict(self.replica), "state": "closed"}
        s.cancel_reason = "destroyed"
        self._close(s, cancel=True)
        self.ended.record(tenant_id, session_id, why)
        return info

    def _close(self: SessionManager, s: Session, cancel: bool = False) -> None:
        """Destroy a session this replica held (already out of its table): row ``closing``, box
        and workspace torn down (``cancel``: what runs is cancelled first), row deleted. A
        workspace left (still mounted, or the destroy is no longer this replica's: fenced, or
        another replica claimed the row to finish it) leaves the row to whoever finishes it."""
        key = (s.tenant_id, s.session_id)
        with self._destroying(key):
            try:
                self._mark_closing(s.tenant_id, s.session_id)
                marked = True
            except Exception:  # noqa: BLE001 - the box must go all the same (it left our table)
                log.exception("marking session %s/%s closing failed; tearing it down anyway", *key)
                marked = False
            proceed = (lambda: self._still_destroying(*key)) if marked else None
            done = self._stop_and_teardown(s, proceed=proceed) if cancel else self._teardown(s, proceed=proceed)
            if not marked:
                self.registry.delete(s.tenant_id, s.session_id)
            elif done:
                self._delete_closing(s.tenant_id, s.session_id)
            else:
                log.warning("session %s/%s: its workspace is left, and its row `closing` for a later sweep", *key)

    @contextmanager
    def _destroying(self: SessionManager, key: tuple[str, str]) -> Iterator[bool]:
        """A destroy of ``key`` runs in this process for the block (``_closing``: requests and
        finishers leave it alone); yields False, marking nothing, when one already runs."""
        with self._lock:
            taken = key not in self._closing
            self._closing.add(key)
        try:
            yield taken
        finally:
            if taken:
                with self._lock:
                    self._closing.discard(key)

    def _mark_closing(self: SessionManager, tenant_id: str, session_id: str) -> None:
        """The row says a destroy by this replica is under way (one UPDATE). ``expires_at`` is
        when a sweep looks at it (``expire``) if it is still there: a destroy cut off is
        finished then."""
        now = time.time()
        ttl = self.settings.lease_ttl
        self.registry.update(tenant_id, session_id, state="closing", owner=self.replica, lease_expires=now + ttl,
                             expires_at=now + ttl)

    def _still_destroying(self: SessionManager, tenant_id: str, session_id: str, row_id: str | None = None) -> bool:
        """Whether the row still records this replica's destroy of the session (and this replica
        is not fenced): asked before the workspace is deleted, so a destroy another replica took
        over (it found this one a lease late) never deletes a workspace of the name's next session."""
        if self._fenced:
            return False
        rec = self.registry.get(tenant_id, session_id)
        return (rec is not None and rec.state == "closing" and rec.owner == self.replica
                and (row_id is None or rec.id == row_id))

    def _delete_closing(self: SessionManager, tenant_id: str, session_id: str, row_id: str | None = None) -> None:
        """Delete the row of a finished destroy, unless it no longer records this replica's destroy
        (another replica claimed it to finish it, or it finished it and the name is used again)."""
        if self._fenced or not self.registry.delete(tenant_id, session_id, row_id=row_id, owner=self.replica,
                                                    state="closing"):
            log.warning("session %s/%s: its row is no longer this destroy's; left as it is", tenant_id, session_id)

    def _being_destroyed(self: SessionManager, rec: SessionRecord) -> ProviderUnavailableError:
        return ProviderUnavailableError(
            f"session {rec.tenant_id}/{rec.session_id} is being destroyed; retry",
            details={"tenant_id": rec.tenant_id, "session_id": rec.session_id, "state": "closing"})

    def destroy_unloaded(self: SessionManager, tenant_id: str, session_id: str,
                         why: str = "destroyed") -> dict[str, Any]:
        """Destroy a session this replica holds no box for (paused, lost, a dead replica's, or
        one whose destroy was cut off). Answers what ``destroy`` answers for a loaded one."""
        rec = self.registry.get(tenant_id, session_id)
        if rec is None:
            raise SessionNotFoundError(f"no session {tenant_id}/{session_id}",
                                       details={"tenant_id": tenant_id, "session_id": session_id})
        if rec.state == "closing":
            if not self.finish_closing(rec):
                raise self._being_destroyed(rec)
            return {**record_out(rec), "state": "closed"}
        if rec.owner not in (None, self.replica) and rec.lease_live() and rec.state != "lost":
            raise self._owned_elsewhere(rec)
        with self._destroying((tenant_id, session_id)) as taken:
            if not taken:
                raise self._being_destroyed(rec)
            self._mark_closing(tenant_id, session_id)
            if self._remove_remnants(rec):
                self._delete_closing(tenant_id, session_id, rec.id)
            else:
                log.warning("session %s/%s: its workspace is left, and its row `closing` for a later sweep",
                            tenant_id, session_id)
        self.ended.record(tenant_id, session_id, why)
        return {**record_out(rec), "state": "closed"}

    def _remove_remnants(self: SessionManager, rec: SessionRecord) -> bool:
        """A session's box (a Docker container or a pod, by its handle) and workspace, from its row alone
        (which this replica holds ``closing``); False when the workspace was left (``remove_workspace``).
        A container while the provider is still starting: raises, so the row stays ``closing``
        and is finished later (its row must not go before the container it names)."""
        current = self._current_or_none()
        if box_ref(rec.box_handle):
            if current is None:
                raise ProviderUnavailableError(
                    f"the provider is not ready to remove session {rec.tenant_id}/{rec.session_id}'s box; "
                    "its destroy is finished once it is", details={"tenant_id": rec.tenant_id,
                                                                   "session_id": rec.session_id, "state": "closing"})
            remover = getattr(current, "remove_box", None)
            if remover is not None:
                remover(rec.box_handle)
        path = self.record_workspace(rec)
        if mounted(path):
            _reap_dead_boxes()
        return remove_workspace(path, lambda: self._still_destroying(rec.tenant_id, rec.session_id, rec.id))

    def _destroyer_gone(self: SessionManager, rec: SessionRecord) -> bool:
        """Whether nobody tears down the session of a ``closing`` row any more, given that no
        destroy of it runs in this process: the row is this replica's (written by an earlier run
        of it, or by a destroy that failed), or its replica has not heartbeaten for a lease (dead,
        or cut off: it fenced itself by then) or left. A live replica finishes its own rows."""
        if rec.owner in (None, self.replica):
            return True
        beats = {r["id"]: r.get("heartbeat") for r in self.registry.replicas()}
        beat = beats.get(rec.owner)
        return beat is None or beat < time.time() - self.settings.lease_ttl

    def finish_closing(self: SessionManager, rec: SessionRecord) -> bool:
        """Finish the destroy a ``closing`` row records when its destroyer is gone (see the
        module docstring): claim the row (one replica wins), remove the box and workspace,
        delete the row. True when this call finished it; False when it is left (its destroyer is
        alive, another replica finishes it, or the teardown failed: tried again later)."""
        key = (rec.tenant_id, rec.session_id)
        if rec.state != "closing":
            return False
        with self._destroying(key) as taken:
            return taken and self._finish(rec, key)  # not taken: a destroy of it runs in this process

    def _finish(self: SessionManager, rec: SessionRecord, key: tuple[str, str]) -> bool:
        try:
            if not self._destroyer_gone(rec):
                return False
            claimed = self.registry.claim(rec.tenant_id, rec.session_id, self.replica, self.settings.lease_ttl)
            if claimed is None or claimed.id != rec.id or claimed.state != "closing":
                return False  # another replica finishes it, it is gone, or a new session has the name
            log.warning("finishing the destroy of session %s/%s that replica %s began and did not end",
                        rec.tenant_id, rec.session_id, rec.owner)
            if not self._remove_remnants(claimed):
                raise RuntimeError(f"workspace {self.record_workspace(claimed)} was left")
            self._delete_closing(rec.tenant_id, rec.session_id, claimed.id)
            self._finish_failed.pop(key, None)
            return True
        except Exception:  # noqa: BLE001 - the row stays closing: tried again by a later sweep
            log.exception("finishing the destroy of session %s/%s failed", rec.tenant_id, rec.session_id)
            self._finish_failed[key] = time.time() + FINISH_RETRY
            return False

    def finish_abandoned(self: SessionManager, records: list[SessionRecord]) -> list[tuple[str, str]]:
        """``finish_closing`` for each ``closing`` row of ``records`` (at start, and from the
        sweep once a row's ``expires_at`` passed); the keys finished."""
        now = time.time()
        done = []
        for rec in records:
            key = (rec.tenant_id, rec.session_id)
            if rec.state != "closing" or self._finish_failed.get(key, 0.0) > now:
                continue
            if self.finish_closing(rec):
                done.append(key)
        return done

    def _stop_and_teardown(self: SessionManager, s: Session, keep_workspace: bool = False,
                           proceed: Callable[[], bool] | None = None) -> bool:
        """Cancel whatever the session is running, then tear its box (and workspace) down."""
        if s.provider is not None and s.instance_id is not None:
            try:
                s.provider.cancel(s.instance_id)
            except SandboxError:
                pass
        return self._teardown(s, keep_workspace, proceed)

    def _teardown(self: SessionManager, s: Session, keep_workspace: bool = False,
                  proceed: Callable[[], bool] | None = None) -> bool:
        """Destroy the session's box and (unless ``keep_workspace``) its workspace; False when the
        workspace was to go and is left (``remove_workspace``: mounted, or ``proceed`` said no)."""
        removed = True
        done = threading.Event()
        remove = bool(s.workspace) and not keep_workspace
        if remove:
            with self._lock:
                self._deleting[s.workspace or ""] = done
        try:
            with s.lock:
                if s.provider is not None and s.instance_id is not None:
                    self._destroy_instance(s.provider, s.instance_id)
                    s.instance_id = None
                elif s.pending_handle is not None:  # not re-attached yet: its box goes by the row's handle
                    self._remove_pending_box(s)
                if remove:
                    removed = remove_workspace(s.workspace or "", proceed)
        finally:
            done.set()
            if remove:
                with self._lock:
                    if self._deleting.get(s.workspace or "") is done:
                        del self._deleting[s.workspace or ""]
        return removed


def _reap_dead_boxes() -> None:
    """A box whose execbox process was killed (``kill -9``) still binds its session's workspace
    on this host until someone removes it: the jail does (processes, cgroup, mounts of boxes whose
    owning process is gone, and only those), as it does when a box starts on such a workspace."""
    try:
        from ...boxes.jail_box import reap_stale

        reaped = reap_stale()
    except Exception:  # noqa: BLE001 - no jail here, or it failed: the workspace is left, tried again later
        log.warning("removing boxes of dead execbox processes failed", exc_info=True)
        return
    if reaped:
        log.warning("removed %d boxes of dead execbox processes", len(reaped))


def _box_running(s: Session) -> bool:
    return (not s.closed and s.state == "running" and s.provider is not None and s.instance_id is not None
            and s.provider.initialized)
