"""Sessions: (tenant_id, session_id) -> one instance on a provider, with its own workspace.

Created on first use, serialized by a lock per session, reaped when idle, bounded globally
(SB004/503) and per tenant (SB008/429). For self-hosted providers the workspace is a host
directory under <data_dir>/workspaces/<tenant>/<session>, so a box that dies is recreated with
its files intact: the death is reported once (SB009) and the next use gets a fresh box.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import (
    InstanceCreationError,
    InvalidConfigError,
    OutOfMemoryError,
    ProviderUnavailableError,
    RateLimitError,
    SandboxError,
    SessionNotFoundError,
)
from ..providers.base import SandboxProvider
from . import egress_hook
from .config import ServiceSettings
from .metrics import ServiceMetrics

log = logging.getLogger("execbox.service.sessions")

NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)


def check_name(value: str, field_name: str) -> str:
    """Tenant and session ids become directory names: a strict charset, no '.', '..' or '/'."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise InvalidConfigError(
            f"{field_name} must be 1-64 characters of letters, digits, '_', '.', '-' (not starting with '.' "
            "or '-')", details={"field": field_name})
    return value


class ProviderSource(Protocol):
    """What the manager needs from the provider holder (ProviderConfig in production)."""

    def current(self) -> SandboxProvider: ...

    def candidates(self) -> list[SandboxProvider]: ...


@dataclass(eq=False)
class Session:
    tenant_id: str
    session_id: str
    workspace: str | None
    provider: SandboxProvider | None = None
    instance_id: str | None = None
    created_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    busy: int = 0
    operations: int = 0
    boxes_started: int = 0
    closed: bool = False
    network: dict[str, Any] | None = None  # issue 14 hook: the session's narrowed egress policy

    def to_dict(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id, "session_id": self.session_id,
            "provider": self.provider.name if self.provider else None, "instance_id": self.instance_id,
            "created_at": self.created_at, "idle_seconds": round(time.monotonic() - self.last_used, 3),
            "busy": self.busy > 0, "operations": self.operations, "boxes_started": self.boxes_started,
            **egress_hook.describe(self),  # issue 14: the effective network policy
        }


MOUNT_WAIT_SECONDS = 30.0


def _mounted(path: str) -> bool:
    """Whether something is mounted on ``path`` (a backend may bind a box's workspace there)."""
    real = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and fields[4].replace("\\040", " ") == real:
                    return True
    except OSError:
        return False
    return False


def remove_workspace(path: str) -> None:
    """Delete a session workspace once its box's teardown has released it.

    Backends may finish tearing a box down in the background (the jail unmounts the workspace
    image after the kill); deleting under a live mount would only empty the mounted view.
    """
    deadline = time.monotonic() + MOUNT_WAIT_SECONDS
    while _mounted(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    if _mounted(path):
        log.error("workspace %s is still mounted after %ss; leaving it", path, MOUNT_WAIT_SECONDS)
        return
    shutil.rmtree(path, ignore_errors=True)


def _accepts_workspace(provider: SandboxProvider) -> bool:
    try:
        return "workspace" in inspect.signature(provider.create_instance).parameters
    except (TypeError, ValueError):
        return False


class SessionManager:
    def __init__(self, providers: ProviderSource, settings: ServiceSettings, workspaces_root: str,
                 metrics: ServiceMetrics | None = None) -> None:
        self.providers = providers
        self.settings = settings
        self.workspaces_root = workspaces_root
        self.metrics = metrics
        self._sessions: dict[tuple[str, str], Session] = {}
        self._running: dict[str, int] = {}  # tenant -> executions running
        self._inflight: dict[str, int] = {}  # tenant -> session requests in flight (incl. queued)
        self._oneshots: dict[str, SandboxProvider] = {}
        self._deleting: dict[str, threading.Event] = {}  # workspace path -> removal finished
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None

    # -- limits -----------------------------------------------------------------------------
    @contextmanager
    def execution_slot(self, tenant_id: str) -> Iterator[None]:
        """Count one running execution against the tenant's concurrency limit (SB008 beyond)."""
        with self._slot(self._running, tenant_id, self.settings.tenant_max_executions,
                        "tenant_max_executions", "executions", "executions running"):
            yield

    @contextmanager
    def _slot(self, counter: dict[str, int], tenant_id: str, limit: int, reason: str, label: str,
              what: str) -> Iterator[None]:
        with self._lock:
            current = counter.get(tenant_id, 0)
            if current >= limit:
                self._rejected(label)
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

    def _rejected(self, limit: str) -> None:
        if self.metrics is not None:
            self.metrics.rate_limited.labels(limit).inc()

    def _register(self, tenant_id: str, session_id: str) -> Session:
        """Find or add the session record (under self._lock) and mark it busy."""
        key = (tenant_id, session_id)
        s = self._sessions.get(key)
        if s is None:
            total = len(self._sessions)
            if total >= self.settings.max_sessions:
                raise InstanceCreationError(
                    f"the service holds its maximum of {self.settings.max_sessions} sessions; "
                    "wait for idle sessions to be reaped or raise SANDBOX_MAX_SESSIONS",
                    details={"reason": "max_sessions", "limit": self.settings.max_sessions, "active": total})
            mine = sum(1 for t, _ in self._sessions if t == tenant_id)
            if mine >= self.settings.tenant_max_sessions:
                self._rejected("sessions")
                raise RateLimitError(
                    f"tenant {tenant_id!r} holds its maximum of {self.settings.tenant_max_sessions} sessions",
                    details={"reason": "tenant_max_sessions", "limit": self.settings.tenant_max_sessions,
                             "tenant_id": tenant_id})
            s = Session(tenant_id, session_id, os.path.join(self.workspaces_root, tenant_id, session_id))
            self._sessions[key] = s
        s.busy += 1
        s.last_used = time.monotonic()
        return s

    # -- using a session --------------------------------------------------------------------
    @contextmanager
    def session(self, tenant_id: str, session_id: str, template: str = "python") -> Iterator[Session]:
        """The session with a live instance, held exclusively for the duration of the block.

        Requests queued on a busy session hold a worker thread each, so a tenant may only have
        ``tenant_max_requests`` session requests in flight (SB008 beyond): one tenant cannot
        starve the others of threads.
        """
        check_name(tenant_id, "tenant_id")
        check_name(session_id, "session_id")
        with self._slot(self._inflight, tenant_id, self.settings.tenant_max_requests,
                        "tenant_max_requests", "requests", "session requests in flight"):
            with self._held(tenant_id, session_id, template) as s:
                yield s

    @contextmanager
    def _held(self, tenant_id: str, session_id: str, template: str) -> Iterator[Session]:
        while True:
            with self._lock:
                s = self._register(tenant_id, session_id)
            s.lock.acquire()
            if not s.closed:
                break
            s.lock.release()  # destroyed while we waited: start over with a fresh record
            self._release(s)
        try:
            self._ensure_instance(s, template)
            try:
                yield s
            except (ProviderUnavailableError, OutOfMemoryError):
                self._drop_if_dead(s)
                raise
            s.operations += 1
        finally:
            s.lock.release()
            self._release(s)

    def _release(self, s: Session) -> None:
        with self._lock:
            s.busy -= 1
            s.last_used = time.monotonic()

    def _ensure_instance(self, s: Session, template: str) -> None:
        prov = s.provider
        if s.instance_id is not None and prov is not None:
            if not prov.initialized:  # provider swapped and shut down: move to the current one quietly
                s.instance_id = None
            elif not self._alive(prov, s.instance_id):
                dead = s.instance_id
                self._destroy_instance(prov, dead)
                s.instance_id = None
                if self.metrics is not None:
                    self.metrics.boxes_died.inc()
                raise ProviderUnavailableError(
                    f"the box of session {s.tenant_id}/{s.session_id} died; it is recreated on next use"
                    + (" with its workspace intact" if s.workspace else ""),
                    details={"box_died": True, "instance_id": dead, "recreated_on_next_use": True,
                             "tenant_id": s.tenant_id, "session_id": s.session_id})
        if s.instance_id is None:
            self._create_instance(s, template)

    @contextmanager
    def _leased(self) -> Iterator[SandboxProvider]:
        """The current provider, pinned (when the holder supports leases) so a hot reload cannot
        shut it down between choosing it and creating an instance on it."""
        lease = getattr(self.providers, "lease", None)
        if lease is None:
            yield self.providers.current()
            return
        with lease() as prov:
            yield prov

    def _create_instance(self, s: Session, template: str) -> None:
        with self._leased() as prov:
            self._create_on(prov, s, template)

    def _create_on(self, prov: SandboxProvider, s: Session, template: str) -> None:
        kwargs: dict[str, Any] = {"tenant_id": s.tenant_id, "session_id": s.session_id}
        if s.workspace and _accepts_workspace(prov):
            self._make_workspace(s)
            kwargs["workspace"] = s.workspace
        else:
            s.workspace = None
        try:
            inst = prov.create_instance(template=template, **kwargs)
        except BaseException:
            if s.boxes_started == 0:
                self._forget(s)
            raise
        s.provider, s.instance_id = prov, inst.instance_id
        s.boxes_started += 1
        egress_hook.apply(prov, s)  # issue 14: tenant cap and the session's narrowed network policy

    def _make_workspace(self, s: Session) -> None:
        """root/tenant are 0711 (a box's uid may traverse, never list); the session dir is the box's."""
        with self._lock:
            pending = self._deleting.get(s.workspace or "")
        if pending is not None:  # the previous session of this name is still being removed
            pending.wait(MOUNT_WAIT_SECONDS + 5)
        tenant_dir = os.path.join(self.workspaces_root, s.tenant_id)
        for d in (self.workspaces_root, tenant_dir):
            if not os.path.isdir(d):
                os.makedirs(d, exist_ok=True)
                os.chmod(d, 0o711)
        os.makedirs(s.workspace or "", mode=0o700, exist_ok=True)

    def _forget(self, s: Session) -> None:
        """A session whose first box never started does not count against any limit."""
        with self._lock:
            if self._sessions.get((s.tenant_id, s.session_id)) is s and s.busy <= 1:
                del self._sessions[(s.tenant_id, s.session_id)]
                s.closed = True
        if s.closed and s.workspace:
            remove_workspace(s.workspace)

    @staticmethod
    def _alive(prov: SandboxProvider, instance_id: str) -> bool:
        probe = getattr(prov, "instance_alive", None)
        return True if probe is None else bool(probe(instance_id))

    def _drop_if_dead(self, s: Session) -> None:
        """After an SB009/SB006 the error already told the client; the next use starts a new box."""
        if s.provider is None or s.instance_id is None:
            return
        if not self._alive(s.provider, s.instance_id):
            self._destroy_instance(s.provider, s.instance_id)
            s.instance_id = None
            if self.metrics is not None:
                self.metrics.boxes_died.inc()

    @staticmethod
    def _destroy_instance(prov: SandboxProvider, instance_id: str) -> None:
        try:
            prov.destroy_instance(instance_id)
        except Exception:  # noqa: BLE001 - a dead box may fail to tear down; nothing else to do
            log.exception("destroying instance %s failed", instance_id)

    # -- one-shot ---------------------------------------------------------------------------
    @contextmanager
    def oneshot(self, tenant_id: str, template: str = "python") -> Iterator[tuple[SandboxProvider, str]]:
        """A fresh instance for one run, always destroyed afterwards."""
        check_name(tenant_id, "tenant_id")
        with self._leased() as prov:
            inst = prov.create_instance(template=template, tenant_id=tenant_id)
            with self._lock:
                self._oneshots[inst.instance_id] = prov
            try:
                egress_hook.apply_to(prov, tenant_id, inst.instance_id)  # issue 14: the tenant's cap
                yield prov, inst.instance_id
            finally:
                with self._lock:
                    self._oneshots.pop(inst.instance_id, None)
                self._destroy_instance(prov, inst.instance_id)

    # -- admin ------------------------------------------------------------------------------
    def list(self, tenant_id: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            items = [s for s in self._sessions.values() if tenant_id is None or s.tenant_id == tenant_id]
        return [s.to_dict() for s in sorted(items, key=lambda s: (s.tenant_id, s.session_id))]

    def count(self) -> int:
        return len(self._sessions)

    def get(self, tenant_id: str, session_id: str) -> Session | None:
        return self._sessions.get((tenant_id, session_id))

    def destroy(self, tenant_id: str, session_id: str) -> dict[str, Any]:
        """Stop whatever runs in the session, destroy its box and delete its workspace."""
        check_name(tenant_id, "tenant_id")
        check_name(session_id, "session_id")
        with self._lock:
            s = self._sessions.pop((tenant_id, session_id), None)
            if s is not None:
                s.closed = True
        if s is None:
            raise SessionNotFoundError(f"no session {tenant_id}/{session_id}",
                                       details={"tenant_id": tenant_id, "session_id": session_id})
        info = s.to_dict()
        self._stop_and_teardown(s)
        return info

    def _stop_and_teardown(self, s: Session) -> None:
        """Cancel whatever the session is running, then tear its box and workspace down."""
        if s.provider is not None and s.instance_id is not None:
            try:
                s.provider.cancel(s.instance_id)
            except SandboxError:
                pass
        self._teardown(s)

    def _teardown(self, s: Session) -> None:
        done = threading.Event()
        if s.workspace:
            with self._lock:
                self._deleting[s.workspace] = done
        try:
            with s.lock:
                if s.provider is not None and s.instance_id is not None:
                    self._destroy_instance(s.provider, s.instance_id)
                    s.instance_id = None
                if s.workspace:
                    remove_workspace(s.workspace)
        finally:
            done.set()
            if s.workspace:
                with self._lock:
                    if self._deleting.get(s.workspace) is done:
                        del self._deleting[s.workspace]

    # -- idle reaping -----------------------------------------------------------------------
    def reap_idle(self) -> list[tuple[str, str]]:
        """Destroy sessions unused for longer than idle_timeout; return their keys."""
        cutoff = time.monotonic() - self.settings.idle_timeout
        with self._lock:
            idle = [s for s in self._sessions.values() if s.busy == 0 and s.last_used < cutoff]
            for s in idle:
                del self._sessions[(s.tenant_id, s.session_id)]
                s.closed = True
        for s in idle:
            log.info("reaping idle session", extra={"fields": {
                "tenant_id": s.tenant_id, "session_id": s.session_id, "instance_id": s.instance_id,
                "operation": "reap_idle"}})
            self._teardown(s)
            if self.metrics is not None:
                self.metrics.sessions_reaped.inc()
        return [(s.tenant_id, s.session_id) for s in idle]

    def start(self) -> None:
        if self._reaper is None:
            self._stop.clear()
            self._reaper = threading.Thread(target=self._reap_loop, name="execbox-reaper", daemon=True)
            self._reaper.start()

    def _reap_loop(self) -> None:
        while not self._stop.wait(self.settings.sweep_every):
            try:
                self.reap_idle()
            except Exception:  # noqa: BLE001 - keep reaping
                log.exception("idle sweep failed")

    def shutdown(self) -> None:
        """Stop the reaper, destroy every session (and its workspace) and every one-shot box."""
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join(timeout=5)
            self._reaper = None
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
            oneshots = list(self._oneshots.items())
            for s in sessions:
                s.closed = True
        for s in sessions:
            self._stop_and_teardown(s)
        for instance_id, prov in oneshots:
            self._destroy_instance(prov, instance_id)
