"""HTTP client for an execbox service, with the method names of the local ``Sandbox``.

Switching local -> remote is one line::

    sb = Sandbox.create(provider="jail")                      # local
    sb = RemoteSandbox.create("http://127.0.0.1:8080", token)  # remote, same calls below
    sb.files.write("data.txt", "hello")
    sb.run_code("print(open('data.txt').read())").stdout

Service errors come back as the same typed ``SandboxError`` subclasses (SB001-SB009). A timed-out
or out-of-memory run returns its ExecutionResult (``timed_out`` / ``error_code`` set), exactly as
the local Sandbox does, although the service answers it with 408/422.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

import httpx

from ._client_wire import (
    _SSE,
    API_PREFIX,
    DEFAULT_HTTP_TIMEOUT,
    _base_url,
    _content,
    _error,
    _headers,
    _Requests,
    _result_or_raise,
    _StreamState,
    iter_events,
)
from .client_async import AsyncRemoteSandbox
from .errors import ConnectionFailedError, SandboxError
from .models import ExecutionResult, FileInfo, GrepMatch, TextPage
from .providers.base import OutputCallback


class RemoteFiles:
    """Workspace file operations of one RemoteSandbox (paths relative to the workspace)."""

    def __init__(self, sandbox: RemoteSandbox) -> None:
        self._sb = sandbox

    def read(self, path: str, offset: int = 0, limit: int = 2000) -> TextPage:
        return TextPage(**self._sb._post("read", self._sb._req.scoped(path=path, offset=offset, limit=limit)))

    def read_bytes(self, path: str) -> bytes:
        return base64.b64decode(self._sb._post("read_binary", self._sb._req.scoped(path=path))["content_b64"])

    def write(self, path: str, content: str | bytes, mode: str = "overwrite") -> FileInfo:
        return FileInfo(**self._sb._post("write", self._sb._req.scoped(path=path, mode=mode, **_content(content))))

    def write_many(self, files: dict[str, str | bytes]) -> list[FileInfo]:
        sb = self._sb
        tenant = sb.tenant_id or sb._whoami_tenant()
        body = {"files": [{"path": p, **_content(c)} for p, c in files.items()]}
        out = sb._post(f"sessions/{tenant}/{sb.session_id}/copy", body)
        return [FileInfo(**f) for f in out["files"]]

    def list(self, path: str = ".", recursive: bool = False) -> list[FileInfo]:
        out = self._sb._post("list", self._sb._req.scoped(path=path, recursive=recursive))
        return [FileInfo(**f) for f in out["files"]]

    def glob(self, pattern: str) -> list[str]:
        return self._sb._post("glob", self._sb._req.scoped(pattern=pattern))["paths"]

    def grep(self, pattern: str, path: str = ".", glob: str | None = None, max_results: int = 100
             ) -> list[GrepMatch]:
        out = self._sb._post("grep", self._sb._req.scoped(pattern=pattern, path=path, glob=glob,
                                                          max_results=max_results))
        return [GrepMatch(**m) for m in out["matches"]]


class RemoteSandbox:
    """A session on an execbox service: workspace and contexts persist until ``close()``.

    ``tenant_id`` defaults to the token's tenant; ``session_id`` to a fresh random id.
    ``close()`` destroys the session when the token is an admin token (DELETE is admin only);
    otherwise the service's idle reaper (SANDBOX_IDLE_TIMEOUT) frees it.
    """

    def __init__(self, url: str, token: str | None = None, *, tenant_id: str | None = None,
                 session_id: str | None = None, http_client: httpx.Client | None = None) -> None:
        self.url = _base_url(url)
        self.token = token
        self.tenant_id = tenant_id
        self.session_id = session_id or f"s-{uuid.uuid4().hex[:16]}"
        self._req = _Requests(tenant_id, self.session_id)
        self._owns_client = http_client is None
        self._http = http_client or httpx.Client(base_url=self.url, headers=_headers(token),
                                                 timeout=DEFAULT_HTTP_TIMEOUT)
        self.closed = False
        self.files = RemoteFiles(self)

    @classmethod
    def create(cls, url: str, token: str | None = None, *, tenant_id: str | None = None,
               session_id: str | None = None) -> RemoteSandbox:
        return cls(url, token, tenant_id=tenant_id, session_id=session_id)

    # -- transport --------------------------------------------------------------------------
    def _send(self, method: str, path: str, body: dict[str, Any] | None = None,
              timeout: float | None = None) -> httpx.Response:
        if self.closed:
            raise SandboxError("this RemoteSandbox is closed", details={"session_id": self.session_id})
        try:
            return self._http.request(method, f"{API_PREFIX}/{path}", json=body,
                                      timeout=timeout or DEFAULT_HTTP_TIMEOUT)
        except httpx.HTTPError as e:
            raise ConnectionFailedError(f"cannot reach execbox at {self.url}: {e}",
                                        details={"url": self.url}) from e

    def _post(self, path: str, body: dict[str, Any], timeout: float | None = None) -> Any:
        r = self._send("POST", path, body, timeout)
        if r.status_code >= 400:
            raise _error(r)
        return r.json()

    def _whoami_tenant(self) -> str:
        """The token's tenant (the copy route names it in its path)."""
        r = self._send("GET", "whoami")
        if r.status_code >= 400:
            raise _error(r)
        self.tenant_id = r.json()["tenant_id"]
        return self.tenant_id

    def _fetcher(self, path: str) -> bytes:
        return self.files.read_bytes(path)

    # -- execution --------------------------------------------------------------------------
    def _run(self, op: str, body: dict[str, Any], timeout: float | None,
             on_output: OutputCallback | None) -> ExecutionResult:
        http_timeout = self._req.http_timeout(timeout)
        if on_output is None:
            r = self._send("POST", op, body, http_timeout)
            if r.status_code >= 400:
                return _result_or_raise(_error(r), self._fetcher)
            return ExecutionResult.from_dict(r.json(), self._fetcher)
        state = _StreamState(on_output)
        parser = _SSE()
        try:
            with self._http.stream("POST", f"{API_PREFIX}/{op}", json={**body, "stream": True},
                                   timeout=http_timeout) as r:
                if r.status_code >= 400:
                    r.read()
                    return _result_or_raise(_error(r), self._fetcher)
                for line in r.iter_lines():
                    item = parser.feed(line)
                    if item is not None:
                        state.handle(*item)
        except httpx.HTTPError as e:
            raise ConnectionFailedError(f"stream from {self.url} broke: {e}", details={"url": self.url}) from e
        return state.finish(self._fetcher)

    def run_code(self, code: str, language: str = "python", *, timeout: float | None = None,
                 arguments: dict[str, Any] | None = None, context_id: str | None = None,
                 on_output: OutputCallback | None = None) -> ExecutionResult:
        body = self._req.scoped(code=code, language=language, timeout=timeout, arguments=arguments,
                                context_id=context_id)
        return self._run("execute", body, timeout, on_output)

    def run_command(self, command: str, *, timeout: float | None = None, cwd: str | None = None,
                    env: dict[str, str] | None = None, on_output: OutputCallback | None = None) -> ExecutionResult:
        body = self._req.scoped(command=command, timeout=timeout, cwd=cwd, env=env)
        return self._run("bash", body, timeout, on_output)

    # -- lifecycle --------------------------------------------------------------------------
    # -- session state (docs/sessions.md) ----------------------------------------------------
    def _session_call(self, method: str, suffix: str = "") -> dict[str, Any]:
        tenant = self.tenant_id or self._whoami_tenant()
        r = self._send(method, f"sessions/{tenant}/{self.session_id}{suffix}")
        if r.status_code >= 400:
            raise _error(r)
        return r.json()

    def info(self) -> dict[str, Any]:
        """The session's registry entry: state, owning replica, expiry, contexts_lost."""
        return self._session_call("GET")

    def pause(self) -> dict[str, Any]:
        """Stop the session's box (CPU and memory freed); files stay until the retention ends."""
        return self._session_call("POST", "/pause")

    def resume(self) -> dict[str, Any]:
        """Start a paused session's box again under the same id (using it also resumes it)."""
        return self._session_call("POST", "/resume")

    def install(self, pip: list[str] | None = None, npm: list[str] | None = None, *,
                timeout: float | None = None) -> dict[str, Any]:
        """pip/npm packages into the session's workspace (POST .../install); SB errors name what failed."""
        tenant = self.tenant_id or self._whoami_tenant()
        body = {"pip": list(pip or []), "npm": list(npm or []), "timeout": timeout}
        r = self._send("POST", f"sessions/{tenant}/{self.session_id}/install", body,
                       timeout=(timeout or 300) + 30)
        if r.status_code >= 400:
            raise _error(r)
        return r.json()

    def close(self) -> None:
        if self.closed:
            return
        try:
            me = self._send("GET", "whoami", timeout=10)
            if me.status_code == 200 and me.json().get("role") == "admin":
                tenant = self.tenant_id or me.json()["tenant_id"]
                self._send("DELETE", f"sessions/{tenant}/{self.session_id}", timeout=10)
        except (SandboxError, ValueError):
            pass  # tenant token (DELETE is admin only) or unreachable: the idle reaper frees the session
        finally:
            self.closed = True
            if self._owns_client:
                self._http.close()

    def __enter__(self) -> RemoteSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def execute_once(cls, url: str, token: str | None, code: str, language: str = "python",
                     timeout: float | None = None, arguments: dict[str, Any] | None = None, *,
                     tenant_id: str | None = None) -> ExecutionResult:
        """One-shot run on the service (``execbox.execute_code(url=...)``): fresh box, artifacts inline.

        ``tenant_id="default"`` (execute_code's default) means "the token's tenant".
        """
        tenant = None if tenant_id in (None, "default") else tenant_id
        with httpx.Client(base_url=_base_url(url), headers=_headers(token)) as http:
            sb = cls(url, token, tenant_id=tenant, http_client=http)
            sb.session_id = None  # type: ignore[assignment]
            sb._req = _Requests(tenant, None)
            return sb._run("execute", sb._req.scoped(code=code, language=language, timeout=timeout,
                                                     arguments=arguments), timeout, None)


__all__ = ["AsyncRemoteSandbox", "RemoteSandbox", "iter_events"]
