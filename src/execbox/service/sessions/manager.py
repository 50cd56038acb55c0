"""Sessions: (tenant_id, session_id) -> one instance on a provider, with its own workspace.

Which sessions exist, their state and owning replica live in the session registry (SQL when
the service has a store: they survive restarts and are shared by replicas). The box itself is
this replica's: a session is used under a lock per session, its box is created on first use,
and a warm request touches no database (last-used times are flushed by the heartbeat).
Bounded globally (SB004/503) and per tenant (SB008/429), counted from the registry. The
workspace is a host directory, <workspaces>/<registry id>/<tenant>/<session>, so a box that dies, a
pause and a restart all keep the files; a dead box is reported once (SB009).
Making and checking a session's box is in ``boxes.py``; restart, pause/resume and expiry in
``lifecycle.py``; drain and shutdown in ``drain.py``; the Session record in ``model.py``.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext

from ...errors import (
    OutOfMemoryError,
    ProviderUnavailableError,
    RateLimitError,
    SessionDrainingError,
    SessionLostError,
    SessionNotFoundError,
)
from ...providers.base import SandboxProvider
from ..config import ServiceSettings
from ..metrics import ServiceMetrics
from . import notes
from .admin import AdminMixin
from .boxes import BoxesMixin
from .drain import DrainMixin
from .ended import EndedSessions
from .fence import FenceMixin
from .fence import now as fence_now
from .lifecycle import LifecycleMixin
from .limits import TenantCounters, tenant_full
from .model import ProviderSource, Session, SessionBusy, SessionOwnedElsewhere, pick_runtime
from .registry import MemoryRegistry, SessionRecord, SessionRegistry
from .workspace import check_name

log = logging.getLogger("execbox.service.sessions")

CREATE_HEADER = "X-Execbox-Create-Session"
"""The request header whose ``false`` makes an unknown session 404 instead of a new one (session_headers.py)."""

BESIDE_RECHECK = 0.05
"""Seconds between a waiting file operation's looks for a run it can go beside (``session(beside=)``)."""


class SessionManager(BoxesMixin, AdminMixin, LifecycleMixin, DrainMixin, FenceMixin):
    def __init__(self, providers: ProviderSource, settings: ServiceSettings, workspaces_root: str,
                 metrics: ServiceMetrics | None = None, registry: SessionRegistry | None = None) -> None:
        self.providers = providers
        self.settings = settings
        self.metrics = metrics
        self.registry: SessionRegistry = registry if registry is not None else MemoryRegistry()
        self.workspaces_base = workspaces_root
        ident = self.registry.identity() if self.registry.persistent else None
        self.workspaces_root = (os.path.join(workspaces_root, check_name(ident, "registry id")) if ident
                                else workspaces_root)
        """<workspaces dir>/<registry id>: start-up cleanup and Docker's orphan removal only ever look
        here, so services sharing a workspaces dir (different databases) never touch each other's
        workspaces, and equal tenant/session names never share one."""
        self.replica = settings.replica_id or socket.gethostname()
        self._sessions: dict[tuple[str, str], Session] = {}
        self._counters = TenantCounters(self._rejected)
        self._running = self._counters.running
        self._inflight = self._counters.inflight
        self._oneshots: dict[str, SandboxProvider] = {}
        self._deleting: dict[str, threading.Event] = {}  # workspace path -> removal finished
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._draining = False
        self._dirty: dict[tuple[str, str], float] = {}  # last-used times the heartbeat flushes
        self._reap_failed: dict[tuple[str, str], float] = {}  # lifecycle.reap_orphaned
        self._closing: set[tuple[str, str]] = set()  # destroys running in this process (admin.py)
        self._finish_failed: dict[tuple[str, str], float] = {}  # admin.finish_closing: when to try again
        self.ended = EndedSessions()  # how sessions this replica ended lately ended (a new one of the name says so)
        mono, wall = fence_now()  # until the first heartbeat: as if one had just renewed (fence.py)
        self._lease_until = (mono + settings.lease_ttl, wall + settings.lease_ttl)

    # -- limits -----------------------------------------------------------------------------
    @contextmanager
    def execution_slot(self, tenant_id: str) -> Iterator[None]:
        """Count one running execution against the tenant's concurrency limit (SB008 beyond)."""
        with self._counters.slot(self._running, tenant_id, *self._executions_limit()):
            yield

    def _executions_limit(self) -> tuple[int, str, str, str]:
        return self.settings.tenant_max_executions, "tenant_max_executions", "executions", "executions running"

    def _rejected(self, limit: str) -> None:
        if self.metrics is not None:
            self.metrics.rate_limited.labels(limit).inc()

    def draining(self) -> bool:
        return self._draining

    def _refuse_if_draining(self) -> None:
        if self._draining:
            raise SessionDrainingError(f"replica {self.replica} is shutting down and takes no new work; retry",
                                       details={"reason": "draining", "replica": self.replica})

    def workspace_path(self, tenant_id: str, session_id: str) -> str:
        return os.path.join(self.workspaces_root, tenant_id, session_id)

    def record_workspace(self, rec: SessionRecord) -> str:
        """Where a registry row's workspace is: its own path, or the pre-registry-id layout
        <workspaces dir>/<tenant>/<session> a row made by an older version recorded."""
        path = self.workspace_path(rec.tenant_id, rec.session_id)
        legacy = os.path.join(self.workspaces_base, rec.tenant_id, rec.session_id)
        if legacy != path and rec.box_handle.get("workspace") == legacy and os.path.isdir(legacy):
            return legacy
        return path

    # -- finding a session ------------------------------------------------------------------
    def _attach(self, tenant_id: str, session_id: str) -> Session:
        """The local session record (loaded from or added to the registry), marked busy."""
        key = (tenant_id, session_id)
        with self._lock:
            s = self._sessions.get(key)
            if s is not None:
                self._touch(s)
                return s
        loaded = self._load(tenant_id, session_id)
        with self._lock:
            s = self._sessions.setdefault(key, loaded)
            self._touch(s)
            return s

    def _touch(self, s: Session) -> None:
        s.busy += 1
        s.last_used = time.monotonic()
        s.last_used_wall = time.time()
        self._dirty[(s.tenant_id, s.session_id)] = s.last_used_wall

    def _load(self, tenant_id: str, session_id: str) -> Session:
        """One registry transaction: create the row (quotas counted), or get the existing one.
        A session created here is noted for the request that asked (notes.py: its response says
        so); a request that may not create one (X-Execbox-Create-Session: false) gets 404."""
        if not notes.creation_allowed():
            found = self.registry.get(tenant_id, session_id)
            if found is None:
                raise self._not_created(tenant_id, session_id)
            return self._from_record(found)
        try:
            rec, created = self.registry.create(
                tenant_id, session_id, provider=None, runtime=None, owner=self.replica,
                lease_ttl=self.settings.lease_ttl, tenant_limit=self.settings.tenant_max_sessions,
                global_limit=self.settings.max_sessions)
        except RateLimitError as e:
            if e.details.get("reason") == "tenant_max_sessions":
                raise tenant_full(self, e, tenant_id) from None
            raise
        if not created:  # ours after a restart, a dead replica's, or a live replica's
            return self._from_record(rec)
        notes.note_created(tenant_id, session_id, self.ended.pop(tenant_id, session_id))
        return Session(tenant_id, session_id, self.workspace_path(tenant_id, session_id),
                       created_at=rec.created_at)

    def _not_created(self, tenant_id: str, session_id: str) -> SessionNotFoundError:
        ids = {"tenant_id": tenant_id, "session_id": session_id, "reason": "not_created"}
        because = notes.creation_refusal()  # the request's header, or the route's own rule
        previous = self.ended.get(tenant_id, session_id)
        if previous is not None:
            return SessionNotFoundError(
                f"no session {tenant_id}/{session_id}: {previous['why']}; it was not created again because "
                f"{because}", details={**ids, "previous": previous})
        return SessionNotFoundError(
            f"no session {tenant_id}/{session_id} (it never existed, or it ended: closed, deleted, or reaped "
            f"after SANDBOX_IDLE_TIMEOUT); it was not created because {because}", details=ids)

    def _from_record(self, rec: SessionRecord) -> Session:
        """Take over an existing row: ours after a restart, or a dead replica's."""
        ids = {"tenant_id": rec.tenant_id, "session_id": rec.session_id}
        with self._lock:
            destroying = (rec.tenant_id, rec.session_id) in self._closing
        if destroying:  # a destroy here has not written its row yet, or is tearing it down
            raise self._being_destroyed(rec)
        if rec.state == "closing" and self.finish_closing(rec):  # its destroyer is gone: ended now
            raise SessionNotFoundError(f"no session {rec.tenant_id}/{rec.session_id}: it was being destroyed "
                                       "when its replica stopped, and that destroy is finished now",
                                       details={**ids, "state": "closed"})
        if rec.state == "lost":
            raise SessionLostError(
                f"session {rec.tenant_id}/{rec.session_id} is lost: its box and workspace are gone "
                "(host or disk lost); delete it to reuse the name", details={**ids, "state": "lost"})
        if rec.state in ("closing", "closed"):  # its destroyer is alive (or a finish failed): it ends soon
            raise ProviderUnavailableError(f"session {rec.tenant_id}/{rec.session_id} is being destroyed; retry",
                                           details={**ids, "state": rec.state})
        if rec.owner not in (None, self.replica) and rec.lease_live():
            raise self._owned_elsewhere(rec)
        claimed = self.registry.claim(rec.tenant_id, rec.session_id, self.replica, self.settings.lease_ttl)
        if claimed is None:
            fresh = self.registry.get(rec.tenant_id, rec.session_id)
            raise self._owned_elsewhere(fresh or rec)
        s = self.adopt_record(claimed)
        if s is None:
            raise SessionLostError(f"session {rec.tenant_id}/{rec.session_id} is lost: its workspace is gone",
                                   details={**ids, "state": "lost"})
        return s

    def check_owner(self, tenant_id: str, session_id: str) -> None:
        """Raise SessionOwnedElsewhere when another live replica owns the session, and 404 for an
        unknown one the request may not create (notes.creation_allowed). A streamed run calls this
        before it answers 200, so the forwarding middleware can still take the whole request (and
        its event stream) to the owner, and a refusal is still a status. No database read for a
        session held here."""
        check_name(tenant_id, "tenant_id")
        check_name(session_id, "session_id")
        with self._lock:
            if (tenant_id, session_id) in self._sessions:
                return
        if not self.registry.persistent and notes.creation_allowed():
            return
        rec = self.registry.get(tenant_id, session_id)
        if rec is None and not notes.creation_allowed():
            raise self._not_created(tenant_id, session_id)
        if (rec is not None and self.registry.persistent and rec.state not in ("lost", "closing", "closed")
                and rec.owner not in (None, self.replica) and rec.lease_live()):
            raise self._owned_elsewhere(rec)

    def interrupt(self, tenant_id: str, session_id: str) -> bool:
        """Cancel the run the session is serving here, whoever started it (a notebook's interrupt:
        a context's cell is interrupted and its state kept); False when none runs. Raises
        SessionOwnedElsewhere (forwarded) for a session another replica serves, and 404 for one
        that does not exist; never creates one."""
        self.check_owner(tenant_id, session_id)
        with self._lock:
            s = self._sessions.get((tenant_id, session_id))
        if s is None and (not self.registry.persistent or self.registry.get(tenant_id, session_id) is None):
            raise SessionNotFoundError(f"no session {tenant_id}/{session_id}",
                                       details={"tenant_id": tenant_id, "session_id": session_id})
        if s is None or not s.running or s.provider is None or s.instance_id is None:
            return False
        return bool(s.provider.cancel(s.instance_id))

    def _owned_elsewhere(self, rec: SessionRecord) -> SessionOwnedElsewhere:
        urls = {r["id"]: r["url"] for r in self.registry.replicas()}
        url = urls.get(rec.owner or "")
        err = SessionOwnedElsewhere(
            f"session {rec.tenant_id}/{rec.session_id} is served by replica {rec.owner}", forward_to=url,
            details={"tenant_id": rec.tenant_id, "session_id": rec.session_id, "owner": rec.owner,
                     "owner_url": url, "lease_expires": rec.lease_expires})
        # not forwarded (unreachable owner, no secret): any replica may take it over once its lease ends
        left = (rec.lease_expires or 0.0) - time.time()
        err.retry_after = min(max(1, math.ceil(left)), max(1, math.ceil(self.settings.lease_ttl)))
        return err

    # -- using a session --------------------------------------------------------------------
    def beside_run(self, tenant_id: str, session_id: str) -> tuple[SandboxProvider, str] | None:
        """(provider, instance id) of a session a run holds here, when its box serves file
        operations beside the run; None otherwise (the caller then waits for the session).

        Not for lifecycle holds (start, pause, restore): only ``running`` sessions qualify, and the
        box is the one the run uses, so a file operation never reaches a box being replaced."""
        if self._draining:
            return None
        with self._lock:
            s = self._sessions.get((tenant_id, session_id))
            if s is None or s.closed or not s.running or s.provider is None or s.instance_id is None:
                return None
            provider, instance_id = s.provider, s.instance_id
        serves = getattr(provider, "files_beside_runs", None)
        if serves is None or not serves(instance_id):
            return None
        return provider, instance_id

    @contextmanager
    def session(self, tenant_id: str, session_id: str, template: str = "python",
                runtime: str | None = None, beside: Callable[[], bool] | None = None,
                count_execution: bool = False) -> Iterator[Session]:
        """The session with a live instance, held exclusively for the duration of the block.

        Requests queued on a busy session hold a worker thread each, so a tenant may only have
        ``tenant_max_requests`` session requests in flight (SB008 beyond): one tenant cannot
        starve the others of threads. A paused session is resumed by its next use. ``beside``:
        while the session is held, asked every ``BESIDE_RECHECK`` s; once it says so, the wait
        ends with ``SessionBusy`` (a file operation that can go beside a run that has started).
        ``count_execution``: take the tenant's execution slot once the session is held, so a
        request waiting its turn on a busy session is not counted as an execution running; one that
        arrives while the tenant is at its limit is refused at once, before it waits, loads or
        creates anything (a refused run leaves no session behind).
        """
        check_name(tenant_id, "tenant_id")
        check_name(session_id, "session_id")
        self._refuse_if_draining()
        self._refuse_if_fenced()
        if count_execution:
            self._counters.check(self._running, tenant_id, *self._executions_limit())
        with self._counters.slot(self._inflight, tenant_id, self.settings.tenant_max_requests,
                                 "tenant_max_requests", "requests", "session requests in flight"):
            with self._held(tenant_id, session_id, beside) as s, self._admitted(s, count_execution):
                if s.state == "paused":
                    self._mark_running(s)
                pick_runtime(s, runtime)
                self._ensure_instance(s, template)
                try:
                    yield s
                except (ProviderUnavailableError, OutOfMemoryError):
                    self._drop_if_dead(s)
                    raise
                s.operations += 1

    def _execution(self, tenant_id: str, count: bool) -> AbstractContextManager[None]:
        return self.execution_slot(tenant_id) if count else nullcontext()

    @contextmanager
    def _admitted(self, s: Session, count: bool) -> Iterator[None]:
        """The execution slot of a request that holds ``s`` (``count``); refused (another request
        took the last slot since the check on arrival), a session that request just made is
        forgotten, so the refusal leaves nothing behind."""
        with ExitStack() as stack:
            try:
                stack.enter_context(self._execution(s.tenant_id, count))
            except RateLimitError:
                self._forget_unstarted(s)
                raise
            yield

    @contextmanager
    def box_for_operation(self, tenant_id: str, session_id: str, template: str = "python",
                          count_execution: bool = False) -> Iterator[tuple[SandboxProvider, str]]:
        """(provider, instance id) of the session's box for one short operation (a file
        operation, a background process's start or signal): beside a run that holds the session
        (never waiting it out), else with the session held for the block. A run may take the
        session and start only once its box is made (a new session, a resumed one): the wait
        then ends and the operation goes beside that run instead."""
        while True:
            beside = self.beside_run(tenant_id, session_id)
            if beside is not None:
                with self._execution(tenant_id, count_execution):
                    yield beside
                return
            try:
                with self.session(tenant_id, session_id, template,
                                  beside=lambda: self.beside_run(tenant_id, session_id) is not None,
                                  count_execution=count_execution) as s:
                    assert s.provider is not None and s.instance_id is not None
                    yield s.provider, s.instance_id
                return
            except SessionBusy:  # a run took the session while this waited: go beside it
                continue

    @contextmanager
    def _held(self, tenant_id: str, session_id: str,
              beside: Callable[[], bool] | None = None) -> Iterator[Session]:
        while True:
            s = self._attach(tenant_id, session_id)
            if beside is None:
                s.lock.acquire()
            else:
                while not s.lock.acquire(timeout=BESIDE_RECHECK):
                    if beside():
                        self._release(s)
                        raise SessionBusy(f"session {tenant_id}/{session_id} has a run to go beside")
            if not s.closed:
                break
            s.lock.release()  # destroyed while we waited: start over with a fresh record
            self._release(s)
        try:
            yield s
        finally:
            s.lock.release()
            self._release(s)

    def _release(self, s: Session) -> None:
        """The end of a request is a use too: a long run must not look idle (to the orphan sweep
        of other replicas, which reads the registry's ``last_used``) from the moment it began."""
        with self._lock:
            s.busy -= 1
            s.last_used = time.monotonic()
            s.last_used_wall = time.time()
            if not s.closed:
                self._dirty[(s.tenant_id, s.session_id)] = s.last_used_wall

    # -- one-shot ---------------------------------------------------------------------------
    @contextmanager
    def oneshot(self, tenant_id: str, template: str = "python",
                runtime: str | None = None) -> Iterator[tuple[SandboxProvider, str]]:
        """A fresh instance for one run, always destroyed afterwards."""
        check_name(tenant_id, "tenant_id")
        self._refuse_if_draining()
        with self._leased() as prov:
            extra = {"runtime": runtime} if runtime else {}
            inst = prov.create_instance(template=template, tenant_id=tenant_id, **extra)
            with self._lock:
                self._oneshots[inst.instance_id] = prov
            try:
                self._on_oneshot_started(prov, tenant_id, inst.instance_id)
                yield prov, inst.instance_id
            finally:
                with self._lock:
                    self._oneshots.pop(inst.instance_id, None)
                self._destroy_instance(prov, inst.instance_id)
