"""Looking at and destroying sessions: the registry-wide list, one session's state, destroy.

Mixed into SessionManager; apart from the hot path (``manager.py``) because it reads the
registry for *every* replica's sessions and tears boxes and workspaces down.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ...errors import SandboxError, SessionNotFoundError
from .workspace import check_name, remove_workspace

if TYPE_CHECKING:
    from .manager import SessionManager
    from .model import Session


class AdminMixin:
    # -- admin ------------------------------------------------------------------------------
    def list(self: SessionManager, tenant_id: str | None = None) -> list[dict[str, Any]]:
        """Every session in the registry (all replicas'), with this replica's live details."""
        with self._lock:
            local = {k: s for k, s in self._sessions.items() if tenant_id is None or k[0] == tenant_id}
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for rec in self.registry.list(tenant_id):
            key = (rec.tenant_id, rec.session_id)
            row = {"tenant_id": rec.tenant_id, "session_id": rec.session_id, "state": rec.state,
                   "owner": rec.owner, "provider": rec.provider, "instance_id": rec.box_handle.get("instance_id"),
                   "created_at": rec.created_at, "last_used": rec.last_used, "expires_at": rec.expires_at,
                   "lease_expires": rec.lease_expires, "contexts_lost": rec.contexts_lost, "busy": False}
            if key in local:
                row.update(local[key].to_dict(self.replica))
            out[key] = row
        for key, s in local.items():
            out.setdefault(key, s.to_dict(self.replica))
        return [out[k] for k in sorted(out)]

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

    def destroy(self: SessionManager, tenant_id: str, session_id: str) -> dict[str, Any]:
        """Stop whatever runs in the session, destroy its box and delete its workspace."""
        check_name(tenant_id, "tenant_id")
        check_name(session_id, "session_id")
        with self._lock:
            s = self._sessions.pop((tenant_id, session_id), None)
            self._dirty.pop((tenant_id, session_id), None)
            if s is not None:
                s.closed = True
        if s is None:
            return self.destroy_unloaded(tenant_id, session_id)
        info = {**s.to_dict(self.replica), "state": "closed"}
        self.registry.update(tenant_id, session_id, state="closing")
        self._stop_and_teardown(s)
        self.registry.delete(tenant_id, session_id)
        return info

    def _stop_and_teardown(self: SessionManager, s: Session, keep_workspace: bool = False) -> None:
        """Cancel whatever the session is running, then tear its box (and workspace) down."""
        if s.provider is not None and s.instance_id is not None:
            try:
                s.provider.cancel(s.instance_id)
            except SandboxError:
                pass
        self._teardown(s, keep_workspace)

    def _teardown(self: SessionManager, s: Session, keep_workspace: bool = False) -> None:
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
                if remove:
                    remove_workspace(s.workspace or "")
        finally:
            done.set()
            if remove:
                with self._lock:
                    if self._deleting.get(s.workspace or "") is done:
                        del self._deleting[s.workspace or ""]


def _box_running(s: Session) -> bool:
    return (not s.closed and s.state == "running" and s.provider is not None and s.instance_id is not None
            and s.provider.initialized)
