"""AsyncRemoteSandbox: the asyncio twin of execbox.RemoteSandbox (same methods, awaited)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx

from ..errors import ConnectionFailedError, ExecutionTimeoutError, NotTextError, SandboxError
from ..models import ExecutionResult, FileBytes, FileInfo, GlobResult, GrepResult, TextPage
from ..providers.base import OutputCallback
from ..redaction import redact_url_credentials, strip_userinfo
from .bounded import CALL_DEADLINE, MAX_RESPONSE_BYTES, BodyCap, Deadline, LineSplitter
from .commands import AsyncCommands, AsyncRunFn, AsyncStopFn
from .file_results import file_bytes, range_fields, read_bytes_hint
from .process_handles import AsyncProcessHandle, started_pid
from .wire import (
    _SSE,
    API_PREFIX,
    DEFAULT_HTTP_TIMEOUT,
    HTTP_GRACE,
    Reply,
    _base_url,
    _content,
    _headers,
    _Requests,
    _result_or_raise,
    _StreamState,
    closed_error,
    decode,
    reply_error,
    result_from,
    run_deadline_message,
)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value


class AsyncRemoteFiles:
    def __init__(self, sandbox: AsyncRemoteSandbox) -> None:
        self._sb = sandbox

    async def read(self, path: str, offset: int = 0, limit: int = 2000) -> TextPage:
        """Lines ``offset`` .. ``offset+limit`` of a text file of any size; a binary file is a
        ``NotTextError`` (read it with ``read_bytes``)."""
        try:
            out = await self._sb._post("read", self._sb._req.scoped(path=path, offset=offset, limit=limit))
        except NotTextError as e:
            raise read_bytes_hint(e, path) from None
        return decode("a text page", lambda: TextPage(**out))

    async def read_bytes(self, path: str, offset: int | None = None, length: int | None = None) -> FileBytes:
        """A file's bytes (at most 64 MiB, else 413), or ``length`` bytes (at most 64 MiB) from
        ``offset``; ``total_size`` on the result is the file's size, to fetch a larger one in pieces."""
        out = await self._sb._post("read_binary", self._sb._req.scoped(path=path, **range_fields(offset, length)))
        return decode("file content", lambda: file_bytes(out))

    async def write(self, path: str, content: str | bytes, mode: str = "overwrite") -> FileInfo:
        out = await self._sb._post("write", self._sb._req.scoped(path=path, mode=mode, **_content(content)))
        return decode("file info", lambda: FileInfo(**out))

    async def write_many(self, files: dict[str, str | bytes]) -> list[FileInfo]:
        sb = self._sb
        body = {"files": [{"path": p, **_content(c)} for p, c in files.items()]}
        out = await sb._post(f"sessions/{await sb._tenant()}/{sb.session_id}/copy", body)
        return decode("a file list", lambda: [FileInfo(**f) for f in out["files"]])

    async def list(self, path: str = ".", recursive: bool = False) -> list[FileInfo]:
        out = await self._sb._post("list", self._sb._req.scoped(path=path, recursive=recursive))
        return decode("a file list", lambda: [FileInfo(**f) for f in out["files"]])

    async def glob(self, pattern: str, max_results: int | None = None) -> GlobResult:
        """Matching paths, at most ``max_results`` (the server's default: 1000); ``truncated`` on
        the result when more matched."""
        extra = {} if max_results is None else {"max_results": max_results}
        out = await self._sb._post("glob", self._sb._req.scoped(pattern=pattern, **extra))
        return decode("a path list", lambda: GlobResult.from_dict(out))

    async def grep(self, pattern: str, path: str = ".", glob: str | None = None, max_results: int = 100
                   ) -> GrepResult:
        """Matching lines, at most ``max_results``; on the result ``truncated``, ``binary_matches`` and
        ``skipped`` (models.GrepResult)."""
        out = await self._sb._post("grep", self._sb._req.scoped(pattern=pattern, path=path, glob=glob,
                                                                max_results=max_results))
        return decode("a match list", lambda: GrepResult.from_dict(out))

    async def delete(self, path: str) -> None:
        await self._sb._post("delete", self._sb._req.scoped(path=path))

    async def mkdir(self, path: str) -> bool:
        out = await self._sb._post("mkdir", self._sb._req.scoped(path=path))
        return decode("a mkdir answer", lambda: bool(out["created"]))

    async def move(self, source: str, destination: str) -> str:
        out = await self._sb._post("move", self._sb._req.scoped(source=source, destination=destination))
        return decode("a move answer", lambda: _str(out["path"]))


class AsyncRemoteSandbox:
    """The asyncio twin of RemoteSandbox: same methods, awaited. Artifact bytes: ``await files.read_bytes``.

    Same bounds as RemoteSandbox: a wall-clock deadline on every exchange (``asyncio.timeout``)
    and ``max_response_bytes`` on what is buffered.
    """

    def __init__(self, url: str, token: str | None = None, *, tenant_id: str | None = None,
                 session_id: str | None = None, http_client: httpx.AsyncClient | None = None,
                 max_response_bytes: int = MAX_RESPONSE_BYTES, display_name: str | None = None) -> None:
        self.url = _base_url(url)
        self.token = token
        self.tenant_id = tenant_id
        self.session_id = session_id or f"s-{uuid.uuid4().hex[:16]}"
        self.max_response_bytes = max_response_bytes
        shown = strip_userinfo(self.url)  # errors end up in logs: never a user:password@ of the URL
        self._where = display_name or f"execbox at {shown}"
        self._where_details: dict[str, Any] = {} if display_name else {"url": shown}
        self._req = _Requests(tenant_id, self.session_id)
        self._owns_client = http_client is None
        self._http = http_client or httpx.AsyncClient(base_url=self.url, headers=_headers(token),
                                                      timeout=DEFAULT_HTTP_TIMEOUT)
        self.closed = False
        self._no_processes = False  # the service said it has no background processes (then: held runs)
        self.files = AsyncRemoteFiles(self)
        self.commands = AsyncCommands(self)

    @classmethod
    async def create(cls, url: str, token: str | None = None, *, tenant_id: str | None = None,
                     session_id: str | None = None) -> AsyncRemoteSandbox:
        return cls(url, token, tenant_id=tenant_id, session_id=session_id)

    async def _send(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                    seconds: float | None = None,
                    timed_out: tuple[type[SandboxError], str] | None = None) -> Reply:
        """One exchange, read whole within ``seconds`` (see RemoteSandbox._send)."""
        if self.closed:
            raise closed_error("AsyncRemoteSandbox", self.session_id)
        seconds = seconds or CALL_DEADLINE  # looked up per call (tests shorten it)
        error, message = timed_out or (
            ConnectionFailedError, f"{self._where} did not finish answering within {seconds:g}s; gave up")
        dl = Deadline(seconds, error, message)
        try:
            async with asyncio.timeout(seconds):
                async with self._http.stream(method, f"{API_PREFIX}/{path}", json=body,
                                             timeout=seconds if timed_out else min(seconds, DEFAULT_HTTP_TIMEOUT)
                                             ) as r:
                    return Reply(r.status_code, await self._body(r), r.request.url.path)
        except TimeoutError:
            raise dl.failure() from None
        except httpx.HTTPError as e:
            raise self._transport_error(dl, e, "cannot reach") from e

    async def _body(self, r: httpx.Response) -> bytes:
        cap = BodyCap(self.max_response_bytes, "the service's answer")
        cap.declared(r.headers)
        async for chunk in r.aiter_bytes():
            cap.add(chunk)
        return bytes(cap.buf)

    def _transport_error(self, dl: Deadline, e: httpx.HTTPError, doing: str) -> SandboxError:
        if dl.expired:
            return dl.failure()
        why = (f"{type(e).__name__}: {redact_url_credentials(str(e))}" if self._where_details
               else type(e).__name__)  # display_name: no URL
        return ConnectionFailedError(f"{doing} {self._where}: {why}", details=dict(self._where_details))

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = await self._send("POST", path, body)
        if r.status >= 300:
            raise reply_error(r)
        return r.obj()

    async def _lines(self, r: httpx.Response) -> AsyncIterator[str]:
        limit = self.max_response_bytes
        splitter = LineSplitter(limit, 2 * limit, "the event stream")
        async for chunk in r.aiter_text():
            for line in splitter.feed(chunk):
                yield line
        for line in splitter.close():
            yield line

    async def _stream(self, op: str, body: dict[str, Any], seconds: float,
                      on_output: OutputCallback) -> ExecutionResult:
        state, parser = _StreamState(on_output), _SSE(self.max_response_bytes)
        async with self._http.stream("POST", f"{API_PREFIX}/{op}", json={**body, "stream": True},
                                     timeout=seconds) as r:
            if r.status_code >= 300:
                reply = Reply(r.status_code, await self._body(r), r.request.url.path)
                return _result_or_raise(reply_error(reply), None)
            async for line in self._lines(r):  # the service sends a keepalive every second
                item = parser.feed(line)
                if item is not None:
                    state.handle(*item)
        return state.finish(None)

    async def _run(self, op: str, body: dict[str, Any], timeout: float | None,
                   on_output: OutputCallback | None) -> ExecutionResult:
        if self.closed:
            raise closed_error("AsyncRemoteSandbox", self.session_id)
        seconds = self._req.http_timeout(timeout)
        timed_out = (ExecutionTimeoutError, run_deadline_message(self._where, timeout))
        if on_output is None:
            r = await self._send("POST", op, body, seconds=seconds, timed_out=timed_out)
            if r.status >= 300:
                return _result_or_raise(reply_error(r), None)
            return result_from(r.obj(), None)
        dl = Deadline(seconds, *timed_out)
        try:
            async with asyncio.timeout(seconds):
                return await self._stream(op, body, seconds, on_output)
        except TimeoutError:
            raise dl.failure() from None
        except httpx.HTTPError as e:
            raise self._transport_error(dl, e, "the stream broke from") from e

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

    # -- background processes (see RemoteSandbox) --------------------------------------------
    async def _tenant(self) -> str:
        """The tenant the session belongs to: the one given, else the token's (asked once)."""
        if self.tenant_id is None:
            r = await self._send("GET", "whoami")
            if r.status >= 300:
                raise reply_error(r)
            who = r.obj()
            self.tenant_id = decode("whoami", lambda: _str(who["tenant_id"]))
        return self.tenant_id

    async def _processes_path(self, suffix: str = "") -> str:
        return f"sessions/{await self._tenant()}/{self.session_id}/processes{suffix}"

    async def _start_process(self, command: str, timeout: float | None, cwd: str | None,
                             env: dict[str, str] | None, on_output: OutputCallback | None,
                             stdin: bool) -> AsyncProcessHandle | None:
        if self._no_processes:
            return None
        body = {"command": command, "cwd": cwd, "env": env, "stdin": stdin, "timeout": timeout}
        pid = started_pid(await self._send("POST", await self._processes_path(), body), stdin)
        if pid is None:
            self._no_processes = True
            return None
        return AsyncProcessHandle(self, pid, on_output)

    async def _process_read(self, pid: int, stdout_offset: int, stderr_offset: int, wait: float) -> dict[str, Any]:
        query = f"?stdout_offset={stdout_offset}&stderr_offset={stderr_offset}&wait={wait:g}"
        r = await self._send("GET", await self._processes_path(f"/{pid}{query}"), seconds=wait + HTTP_GRACE)
        if r.status >= 300:
            raise reply_error(r)
        return r.obj()

    async def _process_post(self, pid: int, what: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._post(await self._processes_path(f"/{pid}/{what}"), body)

    async def interrupt(self) -> bool:
        """Interrupt the run the session is serving (see RemoteSandbox.interrupt)."""
        out = await self._post(f"sessions/{await self._tenant()}/{self.session_id}/interrupt", {})
        return decode("an interrupt answer", lambda: bool(out["interrupted"]))

    async def close(self) -> None:
        """End the session (``POST sessions/{tenant}/{session}/close``; see RemoteSandbox.close)."""
        if self.closed:
            return
        try:
            tenant = self.tenant_id
            if tenant is None:
                me = await self._send("GET", "whoami", seconds=10)
                tenant = str(me.obj()["tenant_id"]) if me.status == 200 else None
            if tenant is not None:
                await self._send("POST", f"sessions/{tenant}/{self.session_id}/close", seconds=10)
        except (SandboxError, ValueError, KeyError, TypeError):
            pass  # unreachable, or the session is gone: nothing to end here
        finally:
            self.closed = True
            if self._owns_client:
                await self._http.aclose()

    async def __aenter__(self) -> AsyncRemoteSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
