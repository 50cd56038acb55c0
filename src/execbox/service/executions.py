"""One operation through the service: quota slot, session or one-shot box, run, metrics, log, audit.

Routes describe *what* to run (a closure over the provider call); this module owns the order of
the surrounding steps so plain and streamed requests behave the same. Workspace file operations
(HTTP file routes, MCP file tools, the E2B-compatible filesystem) take the same path through
``RunService.file_op``, so quotas, metrics and the audit log cover them too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import InvalidConfigError, SandboxError
from ..models import ExecutionResult
from ..providers.base import OutputCallback, SandboxProvider
from .config import forwarding_enabled
from .logs import OperationLog, memory_mb
from .metrics import ServiceMetrics
from .sessions import SessionManager, notes
from .streaming import Emit, RunHandle

ProviderCall = Callable[[SandboxProvider, str, bool, OutputCallback | None], ExecutionResult]
"""(provider, instance_id, one_shot, on_output) -> result."""


def run_timeout(provider: SandboxProvider, asked: float | None, fallback: float) -> float:
    """A run's timeout: the caller's, else the provider's stored ``timeout`` (which
    ``SANDBOX_TIMEOUT_SEC`` seeds at first boot; the admin API changes it), else ``fallback``.
    One rule for the HTTP routes, MCP and RAGFlow's ``/run``, which each had their own."""
    if asked is not None:
        return asked
    configured = provider.config.get("timeout")
    return float(configured) if configured else fallback


T = TypeVar("T")
FileCall = Callable[[SandboxProvider, str], T]
"""(provider, instance_id) -> whatever the file operation returns."""

FILE_LANGUAGE = "files"
"""The ``language`` label and audit value of a file operation (it runs no interpreter)."""
INSTALL_LANGUAGE = "packages"
"""The ``language`` label and audit value of an in-session install (pip/npm in the session's box)."""


@dataclass
class RunSpec:
    tenant_id: str
    session_id: str | None
    operation: str  # execute_code | run_command | install
    language: str
    code: str
    token_id: str | None
    call: ProviderCall
    notices: dict[str, Any] = field(default_factory=dict)
    """What the session manager tells the caller along with the result (``metadata.session``)."""
    runtime: str | None = None
    """Runtime template for a new session or one-shot box (issue 14); None: the provider's."""
    inflight: str | None = None
    """Set while the run is filed as started (OperationLog.begin): its audit row ends that."""
    cancelled_reason: str | None = None
    """Set when the service cancelled the session's run (fenced, draining, destroyed)."""
    template: str | None = None
    """The template a new session starts with when ``language`` is not one (an install)."""


def _rt(spec: RunSpec) -> dict[str, Any]:
    return {"runtime": spec.runtime} if spec.runtime else {}


def outcome(result: ExecutionResult) -> str:
    if result.timed_out:
        return "timeout"
    if result.error_code == "SB006":
        return "oom"
    if result.metadata.get("cancelled"):
        return "cancelled"
    return "success" if result.exit_code == 0 else "failed"


class RunService:
    def __init__(self, sessions: SessionManager, metrics: ServiceMetrics, oplog: OperationLog) -> None:
        self.sessions = sessions
        self.metrics = metrics
        self.oplog = oplog

    @contextmanager
    def _box(self, spec: RunSpec) -> Iterator[tuple[SandboxProvider, str]]:
        template = spec.template or spec.language
        if spec.session_id is None:
            with self.sessions.oneshot(spec.tenant_id, template, **_rt(spec)) as pair:
                yield pair
        else:
            with notes.collecting() as seen, self.sessions.session(spec.tenant_id, spec.session_id, template,
                                                                   count_execution=True, **_rt(spec)) as s:
                assert s.provider is not None and s.instance_id is not None
                spec.notices.update(notes.created_notice(seen, spec.tenant_id, spec.session_id))
                s.running += 1
                try:
                    yield s.provider, s.instance_id
                finally:
                    s.running -= 1
                    spec.cancelled_reason = s.cancel_reason
                if s.contexts_lost:  # reported once, on the first run after a restart or pause
                    spec.notices["contexts_lost"] = True
                    s.contexts_lost = False
                    self.sessions.registry.update(s.tenant_id, s.session_id, contexts_lost=False)

    def run(self, spec: RunSpec, on_output: OutputCallback | None = None,
            handle: RunHandle | None = None) -> ExecutionResult:
        """Run and record; SB errors propagate after being counted and logged."""
        provider_name, instance_id = "", None
        started = time.monotonic()
        # a one-shot counts as an execution from the start; a session run once it holds its session
        # (``_box``): one waiting its turn behind the session's current run is not running
        with self.sessions.execution_slot(spec.tenant_id) if spec.session_id is None else nullcontext():
            try:
                with self._box(spec) as (provider, instance_id):
                    provider_name = provider.name
                    if handle is not None:
                        handle.started(provider, instance_id)
                        if handle.cancelled.is_set():
                            raise ClientGone
                    spec.inflight = self.oplog.begin(
                        tenant_id=spec.tenant_id, session_id=spec.session_id, provider=provider_name,
                        operation=spec.operation, instance_id=instance_id, language=spec.language,
                        code=spec.code, token_id=spec.token_id)
                    try:
                        result = spec.call(provider, instance_id, spec.session_id is None, on_output)
                    finally:
                        if handle is not None:
                            handle.finished()
            except SandboxError as e:
                if not _forwarded(e):
                    self._record(spec, provider_name, instance_id, started, "error", None, None, e.code)
                raise
            except ClientGone:
                self._record(spec, provider_name, instance_id, started, "cancelled", None, None, None)
                raise
        if spec.notices:
            result.metadata.setdefault("session", {}).update(spec.notices)
        if result.metadata.get("cancelled"):  # cut off by the service itself, not by the run's own code
            reason = spec.cancelled_reason or ("draining" if self.sessions.draining() else None)
            if reason:
                result.metadata["cancelled_reason"] = reason
        status = outcome(result)
        self._record(spec, provider_name, instance_id, started, status, result.exit_code,
                     memory_mb(result.metadata), result.error_code)
        return result

    def install(self, tenant_id: str, session_id: str, token_id: str | None, pip: list[str], npm: list[str],
                timeout: float | None = None) -> dict[str, Any]:
        """pip/npm into a session's workspace, as a run: the packages' code runs in the box (build
        steps, npm scripts), so it takes the tenant's execution slot (SB008 beyond
        ``tenant_max_executions``), the ``execbox_executions`` metric (language ``packages``) and one
        audit row (operation ``install``, the requirements as code). The HTTP install route and the
        MCP ``install_packages`` tool both come here; the provider's install result is returned."""
        out: dict[str, Any] = {}

        def call(provider: SandboxProvider, instance_id: str, _one_shot: bool,
                 _on_output: OutputCallback | None) -> ExecutionResult:
            do = getattr(provider, "install_packages", None)
            if do is None:
                raise InvalidConfigError(f"provider {provider.name!r} does not support in-session installs; "
                                         "they work on the self-hosted providers (jail, docker)",
                                         details={"provider": provider.name})
            out.update(do(instance_id, pip=pip, npm=npm, timeout=timeout))
            return ExecutionResult("", "", 0, 0.0, metadata={"egress_run_id": out.get("egress_run_id")})

        code = "\n".join([*(f"pip {p}" for p in pip), *(f"npm {n}" for n in npm)])
        self.run(RunSpec(tenant_id, session_id, "install", INSTALL_LANGUAGE, code, token_id, call, template="python"))
        return out

    def file_op(self, tenant_id: str, session_id: str, operation: str, path: str, token_id: str | None,
                call: FileCall[T]) -> T:
        """One workspace file operation on a session's box, counted like a run.

        The same per-tenant execution slot (SB008 beyond ``tenant_max_executions``), the same
        ``execbox_executions`` metric (language ``files``) and one audit record whose ``code`` is
        the path (so ``audit_code`` shows which file; the hash is of the path).

        While a run holds the session, the operation goes to its box beside the run when the box
        serves file operations during runs, as E2B's envd does; otherwise it waits for the session
        like any request (``SessionManager.box_for_operation``)."""
        spec = RunSpec(tenant_id, session_id, operation, FILE_LANGUAGE, path, token_id, _no_call)
        provider_name, instance_id = "", None
        started = time.monotonic()

        def filed(provider: SandboxProvider, iid: str) -> T:
            """Filed as started, like a run: one cut off by a crash is audited `interrupted` at
            the next start (a copy that changed files left no record at all)."""
            nonlocal provider_name, instance_id
            provider_name, instance_id = provider.name, iid
            spec.inflight = self.oplog.begin(
                tenant_id=tenant_id, session_id=session_id, provider=provider.name, operation=operation,
                instance_id=iid, language=FILE_LANGUAGE, code=path, token_id=token_id)
            return call(provider, iid)

        try:
            with self.sessions.box_for_operation(tenant_id, session_id, count_execution=True) as (provider, iid):
                out = filed(provider, iid)
        except Exception as e:  # an SB error, or a protocol error raised by the caller's call
            code = e.code if isinstance(e, SandboxError) else None
            if not (isinstance(e, SandboxError) and _forwarded(e)):
                self._record(spec, provider_name, instance_id, started, "error", None, None, code)
            raise
        self._record(spec, provider_name, instance_id, started, "success", None, None, None)
        return out

    def record(self, spec: RunSpec, provider: str, instance_id: str | None, started: float, status: str,
               exit_code: int | None, error_code: str | None = None) -> None:
        """Count and audit a run that did not go through :meth:`run` (a background process)."""
        self._record(spec, provider, instance_id, started, status, exit_code, None, error_code)

    def _record(self, spec: RunSpec, provider: str, instance_id: str | None, started: float, status: str,
                exit_code: int | None, mem: float | None, error_code: str | None) -> None:
        seconds = time.monotonic() - started
        if spec.language == FILE_LANGUAGE:
            self.metrics.file_operations.labels(spec.operation, status).inc()
        self.metrics.observe_execution(provider or "none", spec.language, status, seconds)
        self.oplog.execution(
            tenant_id=spec.tenant_id, session_id=spec.session_id, provider=provider or "none",
            operation=spec.operation, instance_id=instance_id, language=spec.language, code=spec.code,
            duration_ms=seconds * 1000, status=status, exit_code=exit_code, memory_used_mb=mem,
            error_code=error_code, token_id=spec.token_id, inflight=spec.inflight)
        spec.inflight = None

    def stream(self, spec: RunSpec, artifact_url: str | None) -> Callable[[Emit, RunHandle], None]:
        """The worker body for streaming.stream_run: output events, then artifacts, result, error."""

        def work(emit: Emit, handle: RunHandle) -> None:
            def on_output(stream: str, text: str) -> None:
                if stream in ("stdout", "stderr"):
                    emit(stream, {"text": text})

            try:
                result = self.run(spec, on_output, handle)
            except ClientGone:
                return
            for art in result.artifacts:
                emit("artifact", artifact_event(art.to_dict(include_content=spec.session_id is None),
                                                spec, artifact_url))
            emit("result", result_body(result, spec))
            if result.error_code:
                emit("error", {"code": result.error_code,
                               "message": result.metadata.get("error_message", result.error_code),
                               "details": {"instance_id": result.metadata.get("instance_id")}})

        return work


def _no_call(*_: Any) -> ExecutionResult:  # a file operation's spec carries no run
    raise AssertionError("file operations do not run code")


class ClientGone(Exception):
    """The client went away before the run reached its box (it was not started)."""


def result_body(result: ExecutionResult, spec: RunSpec) -> dict[str, Any]:
    """ExecutionResult as JSON; one-shot runs carry artifact bytes (their box is gone)."""
    body = result.to_dict(include_artifact_content=spec.session_id is None)
    body["tenant_id"] = spec.tenant_id
    body["session_id"] = spec.session_id
    return body


def artifact_event(meta: dict[str, Any], spec: RunSpec, url: str | None) -> dict[str, Any]:
    """Artifact metadata plus how to fetch its bytes (read_binary on the session)."""
    out = dict(meta)
    if spec.session_id is not None and url:
        out["url"] = url
        out["fetch"] = {"method": "POST", "url": url,
                        "json": {"tenant_id": spec.tenant_id, "session_id": spec.session_id,
                                 "path": meta.get("path") or meta["name"]}}
    return out


def _forwarded(e: SandboxError) -> bool:
    """The session's owner is another replica and the request is replayed there, which counts
    and audits it: recording it here too would show every forwarded run twice, once as SB009."""
    return bool(getattr(e, "forward_to", None)) and forwarding_enabled()
