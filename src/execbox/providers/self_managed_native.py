"""``self_managed`` with ``api: execbox``: the remote is another execbox service, so use its own API.

RAGFlow's ``/run`` contract (the default ``api: run``) has no sessions, files, bash or contexts and
calls ``main()`` whenever the code defines it. When the remote is execbox, its sandbox API already
runs everything through execbox's agent, so this provider maps each instance to one remote
session (``execbox.RemoteSandbox``) and passes calls through: the semantics are the
remote agent's, by construction, and nothing is re-implemented here.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import (
    ERRORS_BY_CODE,
    ConnectionFailedError,
    ProviderUnavailableError,
    SandboxError,
    SessionNotFoundError,
)
from ..models import ExecutionResult, FileInfo, GrepMatch, TextPage
from ..redaction import scrub
from .base import OutputCallback

API_RUN = "run"
API_EXECBOX = "execbox"
REMOTE = "the remote executor"


def relayed_error(err: SandboxError, api_key: str | None) -> SandboxError:
    """An error the remote answered, as tenants may see it: the remote may quote the credentials
    it received (some APIs and proxies do), so ``api_key`` (any length) is scrubbed from the
    message and every string in the details; a 401/403 is SB003 naming self_managed.api_key,
    without the remote's body; an unknown or missing code is SB009, never SB000 (a bug here)."""
    status = err.http_status
    if status in (401, 403):
        return ConnectionFailedError(f"{REMOTE} refused self_managed.api_key (HTTP {status})",
                                     details={"http_status": status})
    secrets = [api_key] if api_key else []
    message = scrub(err.message, secrets)
    details = scrub(err.details, secrets) if isinstance(err.details, dict) else {}
    if err.code not in ERRORS_BY_CODE:
        return ProviderUnavailableError(message or f"{REMOTE} failed without saying why", details=details)
    if message == err.message and details == err.details:
        return err
    cls = type(err) if type(err).__init__ is SandboxError.__init__ else ERRORS_BY_CODE[err.code]
    return cls(message, details=details, http_status=err.http_status)


class ExecboxApiMixin:
    """Needs ``self._client`` (httpx client on the endpoint, auth header set), ``self.config``,
    ``self._lock``, ``self.name`` and ``self._unsupported`` from SelfManagedProvider."""

    _client: Any
    _lock: Any
    config: dict[str, Any]
    name: str
    _unsupported: Any

    def _native_init(self) -> None:
        self._sessions: dict[str, Any] = {}

    @property
    def native(self) -> bool:
        return self.config.get("api") == API_EXECBOX

    def _native_create(self, instance_id: str) -> dict[str, Any]:
        from ..sdk.remote import RemoteSandbox  # the SDK's HTTP client (imported late: no cycle)

        sb = RemoteSandbox(self.config["endpoint"], self.config.get("api_key") or None,
                           session_id=f"sm-{uuid.uuid4().hex[:16]}", http_client=self._client,
                           display_name="the remote executor")  # tenants see errors: not the endpoint
        with self._lock:
            self._sessions[instance_id] = sb
        return {"remote_session_id": sb.session_id, "api": API_EXECBOX}

    def _native_destroy(self, instance_id: str) -> bool:
        with self._lock:
            sb = self._sessions.pop(instance_id, None)
        if sb is None:
            return False
        sb.close()  # DELETE with an admin token; otherwise the remote idle reaper frees the session
        return True

    @contextmanager
    def _relaying(self) -> Iterator[None]:
        """Every error of a call to the remote as ``relayed_error`` makes it (no api_key, no SB000)."""
        try:
            yield
        except SandboxError as e:
            out = relayed_error(e, self.config.get("api_key"))
            if out is e:
                raise
            raise out from None

    def _session(self, instance_id: str, op: str) -> Any:
        if not self.native:
            raise self._unsupported(f"{op} (set api: execbox when the endpoint is an execbox service; "
                                    "RAGFlow's /run has no sessions)")
        sb = self._sessions.get(instance_id)
        if sb is None:
            raise SessionNotFoundError(f"no instance {instance_id!r} in provider {self.name!r}",
                                       details={"instance_id": instance_id})
        return sb

    def _native_execute(self, instance_id: str, code: str, language: str, timeout: float,
                        arguments: dict[str, Any] | None, context_id: str | None,
                        on_output: OutputCallback | None) -> ExecutionResult:
        sb = self._session(instance_id, "execute_code")
        with self._relaying():
            r = sb.run_code(code, language, timeout=timeout, arguments=arguments, context_id=context_id,
                            on_output=on_output)
        r.metadata.setdefault("remote_provider", r.metadata.get("provider"))
        r.metadata.update(provider=self.name, instance_id=instance_id, remote_session_id=sb.session_id)
        return r

    def run_command(self, instance_id: str, command: str, timeout: int = 30, *, cwd: str | None = None,
                    env: dict[str, str] | None = None, on_output: OutputCallback | None = None) -> ExecutionResult:
        sb = self._session(instance_id, "run_command")
        with self._relaying():
            r = sb.run_command(command, timeout=timeout, cwd=cwd, env=env, on_output=on_output)
        r.metadata.setdefault("remote_provider", r.metadata.get("provider"))
        r.metadata.update(provider=self.name, instance_id=instance_id, remote_session_id=sb.session_id)
        return r

    def read_file(self, instance_id: str, path: str, offset: int = 0, limit: int = 2000) -> TextPage:
        with self._relaying():
            return self._session(instance_id, "read_file").files.read(path, offset, limit)

    def read_bytes(self, instance_id: str, path: str, offset: int | None = None, length: int | None = None) -> bytes:
        with self._relaying():
            return self._session(instance_id, "read_bytes").files.read_bytes(path, offset=offset, length=length)

    def write_file(self, instance_id: str, path: str, content: str | bytes, mode: str = "overwrite") -> FileInfo:
        with self._relaying():
            return self._session(instance_id, "write_file").files.write(path, content, mode)

    def write_files(self, instance_id: str, files: dict[str, str | bytes]) -> list[FileInfo]:
        with self._relaying():
            return self._session(instance_id, "write_files").files.write_many(files)

    def list_files(self, instance_id: str, path: str = ".", recursive: bool = False) -> list[FileInfo]:
        with self._relaying():
            return self._session(instance_id, "list_files").files.list(path, recursive)

    def glob(self, instance_id: str, pattern: str, max_results: int = 1000) -> list[str]:
        with self._relaying():
            return self._session(instance_id, "glob").files.glob(pattern, max_results)

    def grep(self, instance_id: str, pattern: str, path: str = ".", glob: str | None = None,
             max_results: int = 100) -> list[GrepMatch]:
        with self._relaying():
            return self._session(instance_id, "grep").files.grep(pattern, path, glob, max_results)
