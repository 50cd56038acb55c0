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
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from .errors import ConnectionFailedError, SandboxError, error_from_dict
from .models import ExecutionResult, FileInfo, GrepMatch, TextPage
from .providers.base import OutputCallback

API_PREFIX = "/v1/sandbox"
DEFAULT_HTTP_TIMEOUT = 30.0
HTTP_GRACE = 30.0  # seconds beyond an execution's own timeout before the client gives up


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len(API_PREFIX)] if url.endswith(API_PREFIX) else url


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _content(content: str | bytes) -> dict[str, str]:
    if isinstance(content, bytes):
        return {"content_b64": base64.b64encode(content).decode()}
    return {"content": content}


def _error(response: httpx.Response) -> SandboxError:
    try:
        payload = response.json()
    except ValueError:
        payload = {}
    if not isinstance(payload, dict) or "error" not in payload:
        return SandboxError(f"HTTP {response.status_code} from {response.request.url.path}: "
                            f"{response.text[:200]}", http_status=response.status_code)
    return error_from_dict(payload, response.status_code)


def _result_or_raise(err: SandboxError, fetcher: Any) -> ExecutionResult:
    """SB005/SB006 carry the partial result: hand it back like the local Sandbox does."""
    body = err.details.get("result") if isinstance(err.details, dict) else None
    if err.code in ("SB005", "SB006") and isinstance(body, dict):
        return ExecutionResult.from_dict(body, fetcher)
    raise err


class _SSE:
    """Incremental parser of text/event-stream lines into (event, data) pairs."""

    def __init__(self) -> None:
        self.event = "message"
        self.data: list[str] = []

    def feed(self, line: str) -> tuple[str, Any] | None:
        if line == "":
            if not self.data:
                self.event = "message"
                return None
            out = (self.event, json.loads("\n".join(self.data)))
            self.event, self.data = "message", []
            return out
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        return None


class _StreamState:
    def __init__(self, on_output: OutputCallback | None) -> None:
        self.on_output = on_output
        self.result: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.artifacts: list[dict[str, Any]] = []

    def handle(self, event: str, data: Any) -> None:
        if event in ("stdout", "stderr"):
            if self.on_output is not None:
                self.on_output(event, data.get("text", ""))
        elif event == "artifact":
            self.artifacts.append(data)
        elif event == "result":
            self.result = data
        elif event == "error":
            self.error = data

    def finish(self, fetcher: Any) -> ExecutionResult:
        if self.result is not None:
            return ExecutionResult.from_dict(self.result, fetcher)
        if self.error is not None:
            raise error_from_dict({"error": self.error})
        raise ConnectionFailedError("the event stream ended without a result")


class _Requests:
    """Request bodies shared by the sync and async clients."""

    def __init__(self, tenant_id: str | None, session_id: str | None) -> None:
        self.tenant_id = tenant_id
        self.session_id = session_id

    def scoped(self, **fields: Any) -> dict[str, Any]:
        body = {k: v for k, v in fields.items() if v is not None}
        if self.tenant_id is not None:
            body["tenant_id"] = self.tenant_id
        if self.session_id is not None:
            body["session_id"] = self.session_id
        return body

    @staticmethod
    def http_timeout(timeout: float | None) -> float:
        return (timeout or DEFAULT_HTTP_TIMEOUT) + HTTP_GRACE


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


def iter_events(response_lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """Parse SSE lines (e.g. ``httpx.Response.iter_lines()``) into (event, data) pairs."""
    parser = _SSE()
    for line in response_lines:
        item = parser.feed(line)
        if item is not None:
            yield item


__all__ = ["AsyncRemoteSandbox", "RemoteSandbox", "iter_events"]
