"""The service calls the MCP tools make, scoped to one tenant.

Runs and file tools go through the service's run path (quota slot, session or one-shot box,
metrics, log, audit), like the HTTP routes. Nothing here knows MCP.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidConfigError, SandboxError, SessionNotFoundError
from ..models import ExecutionResult, FileInfo, GrepMatch, Language, TextPage
from ..providers.agent_files import workspace_change
from ..providers.base import OutputCallback, SandboxProvider
from ..service.background import ProcessTable
from ..service.executions import FILE_LANGUAGE, RunService, RunSpec, run_timeout
from ..service.routes.sandbox import check_path  # the same early path check as the HTTP routes
from ..service.sessions import SessionManager, check_name
from ..service.streaming import RunHandle
from .output_cap import DEFAULT_MAX_OUTPUT
from .resource_cap import DEFAULT_MAX_RESOURCE_BYTES

DEFAULT_MAX_TIMEOUT = 300.0


@dataclass(frozen=True)
class Caller:
    """Who is calling: the tenant every tool is confined to, and the token for the audit trail."""

    tenant_id: str
    token_id: str | None = None


class ServiceCore:
    """Sessions, runs and files for MCP tools, on the same objects the HTTP routes use."""

    def __init__(self, sessions: SessionManager, runs: RunService, default_timeout: float,
                 max_timeout: float = DEFAULT_MAX_TIMEOUT, max_code_bytes: int = 1024 * 1024,
                 max_output: int = DEFAULT_MAX_OUTPUT, processes: ProcessTable | None = None,
                 max_resource_bytes: int = DEFAULT_MAX_RESOURCE_BYTES) -> None:
        self.sessions = sessions
        self.runs = runs
        self.processes = processes
        """The replica's background processes (the HTTP API's table; processes.py); None: not served."""
        self.default_timeout = default_timeout
        self.max_timeout = max_timeout
        self.max_code_bytes = max_code_bytes
        self.max_output = max_output
        """Characters of a run's stdout (and of its stderr) a tool result gives the model (output_cap.py)."""
        self.max_resource_bytes = max_resource_bytes
        """Bytes of a file one resources/read gives (resource_cap.py); a larger file is refused."""
        self._implicit: dict[str, tuple[str, str]] = {}  # mapping key -> (tenant, session id)
        self._lock = threading.Lock()

    # -- sessions -------------------------------------------------------------------------------
    def create_session(self, caller: Caller, session_id: str | None = None) -> dict[str, Any]:
        sid = session_id or f"mcp-{uuid.uuid4().hex[:12]}"
        check_name(sid, "session_id")
        with self.sessions.session(caller.tenant_id, sid) as s:
            return s.to_dict()

    def require_session(self, caller: Caller, session_id: str) -> None:
        """A session named by the model must exist: a mistyped id must not become a new, empty
        workspace. Loaded here, or in the registry (paused, another replica's, not yet used since
        a restart)."""
        check_name(session_id, "session_id")
        loaded = self.sessions.get(caller.tenant_id, session_id)
        if loaded is not None and not loaded.closed:
            return
        if self.sessions.registry.get(caller.tenant_id, session_id) is None:
            raise SessionNotFoundError(f"no session {session_id!r} for this tenant: create it with "
                                       "create_session, or leave session_id out to use this conversation's "
                                       "session", details={"session_id": session_id})

    def close_session(self, caller: Caller, session_id: str) -> dict[str, Any]:
        self.require_session(caller, session_id)
        with self._lock:
            for key, value in list(self._implicit.items()):
                if value == (caller.tenant_id, session_id):
                    del self._implicit[key]
        return self.sessions.destroy(caller.tenant_id, session_id, "closed")

    def list_sessions(self, caller: Caller) -> list[dict[str, Any]]:
        return self.sessions.list(caller.tenant_id)

    def implicit_session(self, caller: Caller, key: str) -> str:
        """The session one MCP client session maps to, created on its first stateful use."""
        with self._lock:
            found = self._implicit.get(key)
            if found is not None and found[0] == caller.tenant_id \
                    and self.sessions.get(found[0], found[1]) is not None:
                return found[1]
        sid = self.create_session(caller)["session_id"]
        with self._lock:
            self._implicit[key] = (caller.tenant_id, sid)
        return sid

    def current_implicit(self, caller: Caller, key: str) -> str | None:
        """The client's implicit session if it has one now (never creating it)."""
        with self._lock:
            found = self._implicit.get(key)
        if found is None or found[0] != caller.tenant_id or self.sessions.get(*found) is None:
            return None
        return found[1]

    def end_implicit(self, key: str, tenant_id: str | None = None) -> None:
        """The MCP session ended: close the execbox session it created (only the owner may end it)."""
        with self._lock:
            found = self._implicit.get(key)
            if found is None or (tenant_id is not None and found[0] != tenant_id):
                return
            del self._implicit[key]
        if found is not None and self.sessions.get(*found) is not None:
            try:
                self.sessions.destroy(*found)
            except SessionNotFoundError:
                pass

    def close_all_implicit(self) -> None:
        with self._lock:
            keys = list(self._implicit)
        for key in keys:
            self.end_implicit(key)

    # -- runs -----------------------------------------------------------------------------------
    def timeout(self, asked: float | None) -> tuple[float | None, bool]:
        """The caller's timeout, capped, and whether it was; None when the caller named none (the
        run then takes the provider's own default: ``run_timeout``)."""
        if asked is None:
            return None, False
        if asked <= 0:
            raise InvalidConfigError("timeout must be a positive number of seconds", details={"field": "timeout"})
        if asked > self.max_timeout:
            return self.max_timeout, True
        return asked, False

    def run_timeout(self, provider: SandboxProvider, asked: float | None) -> float:
        """As an HTTP run's (the provider's stored ``timeout`` by default), within ``max_timeout``."""
        return min(run_timeout(provider, asked, self.default_timeout), self.max_timeout)

    def check_code(self, code: str, field: str) -> None:
        size = len(code.encode("utf-8", "surrogatepass"))
        if size > self.max_code_bytes:
            raise InvalidConfigError(f"{field} is {size} bytes; the limit is {self.max_code_bytes}",
                                     details={"field": field, "limit": self.max_code_bytes})

    def run_code(self, caller: Caller, session_id: str | None, code: str, language: str,
                 timeout: float | None, arguments: dict[str, Any] | None, context_id: str | None,
                 handle: RunHandle | None = None) -> ExecutionResult:
        """``handle``: cancelling it stops this run (and only this one), as a streamed HTTP run whose
        client went away (service/streaming.py); a run it stops before it starts raises ClientGone."""
        self.check_code(code, "code")
        lang = Language.parse(language).value

        def call(provider: SandboxProvider, instance_id: str, one_shot: bool,
                 on_output: OutputCallback | None) -> ExecutionResult:
            kwargs: dict[str, Any] = {"inline_artifacts": one_shot}
            if context_id is not None:
                kwargs["context_id"] = context_id
            return provider.execute_code(instance_id, code, lang, self.run_timeout(provider, timeout), arguments,
                                         **kwargs)

        spec = RunSpec(caller.tenant_id, session_id, "execute_code", lang, code, caller.token_id, call)
        return self.runs.run(spec, handle=handle)

    def run_command(self, caller: Caller, session_id: str | None, command: str, timeout: float | None,
                    cwd: str | None, handle: RunHandle | None = None) -> ExecutionResult:
        self.check_code(command, "command")
        if not command.strip():
            raise InvalidConfigError("command must not be empty", details={"field": "command"})
        check_path(cwd, "cwd")

        def call(provider: SandboxProvider, instance_id: str, one_shot: bool,
                 on_output: OutputCallback | None) -> ExecutionResult:
            return provider.run_command(instance_id, command, self.run_timeout(provider, timeout), cwd=cwd)

        spec = RunSpec(caller.tenant_id, session_id, "run_command", "bash", command, caller.token_id, call)
        return self.runs.run(spec, handle=handle)

    def interrupt(self, caller: Caller, session_id: str) -> bool:
        """Interrupt the run the session is serving, whoever started it (SessionManager.interrupt,
        as the HTTP interrupt route); False when none runs."""
        self.require_session(caller, session_id)
        return self.sessions.interrupt(caller.tenant_id, session_id)

    def install(self, caller: Caller, session_id: str, pip: list[str], npm: list[str]) -> dict[str, Any]:
        """pip/npm into the session's workspace, on the run path as the HTTP install route
        (RunService.install): the tenant's execution slot, the metric and an audit row."""
        return self.runs.install(caller.tenant_id, session_id, caller.token_id, pip, npm)

    # -- files ----------------------------------------------------------------------------------
    def read_file(self, caller: Caller, session_id: str, path: str, offset: int, limit: int) -> TextPage:
        check_path(path, "path")
        self.require_session(caller, session_id)
        return self.runs.file_op(caller.tenant_id, session_id, "read_file", path, caller.token_id,
                                 lambda p, i: p.read_file(i, path, offset, limit))

    def read_bytes(self, caller: Caller, session_id: str, path: str, offset: int | None = None,
                   length: int | None = None) -> bytes:
        """The file whole (64 MiB at most), or ``length`` bytes from ``offset``: a ``FileBytes``
        with the file's ``total_size`` where the provider tells it (providers/base.py)."""
        check_path(path, "path")
        self.require_session(caller, session_id)
        return self.runs.file_op(caller.tenant_id, session_id, "read_bytes", path, caller.token_id,
                                 lambda p, i: p.read_bytes(i, path, offset=offset, length=length))

    def write_file(self, caller: Caller, session_id: str, path: str, content: str | bytes, mode: str) -> FileInfo:
        check_path(path, "path")
        self.require_session(caller, session_id)
        return self.runs.file_op(caller.tenant_id, session_id, "write_file", path, caller.token_id,
                                 lambda p, i: p.write_file(i, path, content, mode))

    def list_files(self, caller: Caller, session_id: str, path: str, recursive: bool) -> list[FileInfo]:
        check_path(path, "path")
        self.require_session(caller, session_id)
        return self.runs.file_op(caller.tenant_id, session_id, "list_files", path, caller.token_id,
                                 lambda p, i: p.list_files(i, path, recursive))

    def glob(self, caller: Caller, session_id: str, pattern: str, max_results: int = 1000) -> list[str]:
        check_path(pattern, "pattern")
        self.require_session(caller, session_id)
        return self.runs.file_op(caller.tenant_id, session_id, "glob", pattern, caller.token_id,
                                 lambda p, i: p.glob(i, pattern, max_results))

    def grep(self, caller: Caller, session_id: str, pattern: str, path: str, glob: str | None,
             max_results: int) -> list[GrepMatch]:
        check_path(path, "path")
        check_path(glob, "glob")
        self.require_session(caller, session_id)
        return self.runs.file_op(caller.tenant_id, session_id, "grep", path, caller.token_id,
                                 lambda p, i: p.grep(i, pattern, path, glob, max_results))

    def delete_path(self, caller: Caller, session_id: str, path: str) -> None:
        """A file, or a directory with what it holds (as the HTTP delete route)."""
        check_path(path, "path")
        self.require_session(caller, session_id)
        self.runs.file_op(caller.tenant_id, session_id, "delete_path", path, caller.token_id,
                          lambda p, i: workspace_change(p, "delete_path", "delete workspace files")(i, path))

    def make_dir(self, caller: Caller, session_id: str, path: str) -> bool:
        """A directory and its parents; False when it was one already."""
        check_path(path, "path")
        self.require_session(caller, session_id)
        return bool(self.runs.file_op(
            caller.tenant_id, session_id, "make_dir", path, caller.token_id,
            lambda p, i: workspace_change(p, "make_dir", "make workspace directories")(i, path)))

    def move_path(self, caller: Caller, session_id: str, source: str, destination: str) -> str:
        """Rename or move within the workspace, as ``mv``; where it is now."""
        check_path(source, "source")
        check_path(destination, "destination")
        self.require_session(caller, session_id)
        return str(self.runs.file_op(
            caller.tenant_id, session_id, "move_path", source, caller.token_id,
            lambda p, i: workspace_change(p, "move_path", "move workspace files")(i, source, destination)))

    def list_running_files(self, caller: Caller, session_id: str) -> list[FileInfo] | None:
        """Every file of a session whose box runs on this replica, counted and audited as the
        list_files tool is; None for a session that is paused, not started yet or another
        replica's. Listing never resumes, starts or takes over a box (``SessionManager.if_running``)."""
        spec = RunSpec(caller.tenant_id, session_id, "list_files", FILE_LANGUAGE, ".", caller.token_id, _no_run)
        provider_name, instance_id, started = "", None, time.monotonic()
        try:
            # the slot once the box is in hand: waiting for the session holds none (as runs do)
            beside = self.sessions.beside_run(caller.tenant_id, session_id)
            if beside is not None:  # a run holds the session and its box serves files beside it
                provider_name, instance_id = beside[0].name, beside[1]
                with self.sessions.execution_slot(caller.tenant_id):
                    out = beside[0].list_files(beside[1], ".", True)
            else:
                with self.sessions.if_running(caller.tenant_id, session_id) as s:
                    if s is None or s.provider is None or s.instance_id is None:
                        return None
                    provider_name, instance_id = s.provider.name, s.instance_id
                    with self.sessions.execution_slot(caller.tenant_id):
                        out = s.provider.list_files(s.instance_id, ".", True)
        except Exception as e:
            code = e.code if isinstance(e, SandboxError) else None
            self.runs.record(spec, provider_name, instance_id, started, "error", None, code)
            raise
        self.runs.record(spec, provider_name, instance_id, started, "success", None)
        return out


def _no_run(*_: Any) -> ExecutionResult:  # a file operation's spec carries no run
    raise AssertionError("file operations do not run code")
