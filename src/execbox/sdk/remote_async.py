"""AsyncRemoteSandbox: the asyncio twin of execbox.RemoteSandbox (same methods, awaited)."""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx

from ..errors import ConnectionFailedError, SandboxError, error_from_dict
from ..models import ExecutionResult, FileInfo, GrepMatch, TextPage
from ..providers.base import OutputCallback
from .commands import AsyncCommands, AsyncRunFn, AsyncStopFn
from .wire import (
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
)


class AsyncRemoteFiles:
    def __init__(self, sandbox: AsyncRemoteSandbox) -> None:
        self._sb = sandbox

    async def read(self, path: str, offset: int = 0, limit: int = 2000) -> TextPage:
        return TextPage(**await self._sb._post("read", self._sb._req.scoped(path=path, offset=offset, limit=limit)))

    async def read_bytes(self, path: str) -> bytes:
        out = await self._sb._post("read_binary", self._sb._req.scoped(path=path))
        return base64.b64decode(out["content_b64"])

    async def write(self, path: str, content: str | bytes, mode: str = "overwrite") -> FileInfo:
        out = await self._sb._post("write", self._sb._req.scoped(path=path, mode=mode, **_content(content)))
        return FileInfo(**out)

    async def write_many(self, files: dict[str, str | bytes]) -> list[FileInfo]:
        sb = self._sb
        if sb.tenant_id is None:
            r = await sb._send("GET", "whoami")
            if r.status_code >= 400:
                raise _error(r)
            sb.tenant_id = r.json()["tenant_id"]
        body = {"files": [{"path": p, **_content(c)} for p, c in files.items()]}
        out = await sb._post(f"sessions/{sb.tenant_id}/{sb.session_id}/copy", body)
        return [FileInfo(**f) for f in out["files"]]

    async def list(self, path: str = ".", recursive: bool = False) -> list[FileInfo]:
        out = await self._sb._post("list", self._sb._req.scoped(path=path, recursive=recursive))
        return [FileInfo(**f) for f in out["files"]]

    async def glob(self, pattern: str) -> list[str]:
        return (await self._sb._post("glob", self._sb._req.scoped(pattern=pattern)))["paths"]

    async def grep(self, pattern: str, path: str = ".", glob: str | None = None, max_results: int = 100
                   ) -> list[GrepMatch]:
        out = await self._sb._post("grep", self._sb._req.scoped(pattern=pattern, path=path, glob=glob,
                                                                max_results=max_results))
        return [GrepMatch(**m) for m in out["matches"]]


class AsyncRemoteSandbox:
    """The asyncio twin of RemoteSandbox: same methods, awaited. Artifact bytes: ``await files.read_bytes``."""

    def __init__(self, url: str, token: str | None = None, *, tenant_id: str | None = None,
                 session_id: str | None = None, http_client: httpx.AsyncClient | None = None) -> None:
        self.url = _base_url(url)
        self.token = token
        self.tenant_id = tenant_id
        self.session_id = session_id or f"s-{uuid.uuid4().hex[:16]}"
        self._req = _Requests(tenant_id, self.session_id)
        self._owns_client = http_client is None
        self._http = http_client or httpx.AsyncClient(base_url=self.url, headers=_headers(token),
                                                      timeout=DEFAULT_HTTP_TIMEOUT)
        self.closed = False
        self.files = AsyncRemoteFiles(self)
        self.commands = AsyncCommands(self)

    @classmethod
    async def create(cls, url: str, token: str | None = None, *, tenant_id: str | None = None,
                     session_id: str | None = None) -> AsyncRemoteSandbox:
        return cls(url, token, tenant_id=tenant_id, session_id=session_id)

    async def _send(self, method: str, path: str, body: dict[str, Any] | None = None,
                    timeout: float | None = None) -> httpx.Response:
        if self.closed:
            raise SandboxError("this AsyncRemoteSandbox is closed", details={"session_id": self.session_id})
        try:
            return await self._http.request(method, f"{API_PREFIX}/{path}", json=body,
                                            timeout=timeout or DEFAULT_HTTP_TIMEOUT)
        except httpx.HTTPError as e:
            raise ConnectionFailedError(f"cannot reach execbox at {self.url}: {e}",
                                        details={"url": self.url}) from e

    async def _post(self, path: str, body: dict[str, Any], timeout: float | None = None) -> Any:
        r = await self._send("POST", path, body, timeout)
        if r.status_code >= 400:
            raise _error(r)
        return r.json()

    async def _lines(self, op: str, body: dict[str, Any], timeout: float, state: _StreamState
                     ) -> AsyncIterator[str]:
        async with self._http.stream("POST", f"{API_PREFIX}/{op}", json={**body, "stream": True},
                                     timeout=timeout) as r:
            if r.status_code >= 400:
                await r.aread()
                state.error = _error(r).to_dict()["error"]
                state.error["_status"] = r.status_code
                return
            async for line in r.aiter_lines():
                yield line

    async def _run(self, op: str, body: dict[str, Any], timeout: float | None,
                   on_output: OutputCallback | None) -> ExecutionResult:
        http_timeout = self._req.http_timeout(timeout)
        if on_output is None:
            r = await self._send("POST", op, body, http_timeout)
            if r.status_code >= 400:
                return _result_or_raise(_error(r), None)
            return ExecutionResult.from_dict(r.json())
        state, parser = _StreamState(on_output), _SSE()
        try:
            async for line in self._lines(op, body, http_timeout, state):
                item = parser.feed(line)
                if item is not None:
                    state.handle(*item)
        except httpx.HTTPError as e:
            raise ConnectionFailedError(f"stream from {self.url} broke: {e}", details={"url": self.url}) from e
        if state.error is not None and "_status" in state.error:
            status = state.error.pop("_status")
            return _result_or_raise(error_from_dict({"error": state.error}, status), None)
        return state.finish(None)

    async def run_code(self, code: str, language: str = "python", *, timeout: float | None = None,
                       arguments: dict[str, Any] | None = None, context_id: str | None = None,
                       on_output: OutputCallback | None = None) -> ExecutionResult:
        body = self._req.scoped(code=code, language=language, timeout=timeout, arguments=arguments,
                                context_id=context_id)
        return await self._run("execute", body, timeout, on_output)

    async def run_command(self, command: str, *, timeout: float | None = None, cwd: str | None = None,
                          env: dict[str, str] | None = None,
                          on_output: OutputCallback | None = None) -> ExecutionResult:
        body = self._req.scoped(command=command, timeout=timeout, cwd=cwd, env=env)
        return await self._run("bash", body, timeout, on_output)

    def _command_parts(self, command: str, timeout: float | None, cwd: str | None,
                       env: dict[str, str] | None) -> tuple[AsyncRunFn, AsyncStopFn]:
        async def run(out: OutputCallback) -> ExecutionResult:
            return await self.run_command(command, timeout=timeout, cwd=cwd, env=env, on_output=out)

        return run, None  # kill() cancels the task: the stream closes and the service cancels the run

    async def close(self) -> None:
        if self.closed:
            return
        try:
            me = await self._send("GET", "whoami", timeout=10)
            if me.status_code == 200 and me.json().get("role") == "admin":
                tenant = self.tenant_id or me.json()["tenant_id"]
                await self._send("DELETE", f"sessions/{tenant}/{self.session_id}", timeout=10)
        except (SandboxError, ValueError):
            pass
        finally:
            self.closed = True
            if self._owns_client:
                await self._http.aclose()

    async def __aenter__(self) -> AsyncRemoteSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
