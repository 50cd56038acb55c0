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

import threading
import uuid
from typing import Any

import httpx

from ..errors import ConnectionFailedError, ExecutionTimeoutError, NotTextError, SandboxError
from ..models import ExecutionResult, FileBytes, FileInfo, GlobResult, GrepResult, TextPage
from ..providers.base import OutputCallback
from ..redaction import redact_url_credentials, strip_userinfo
from .bounded import CALL_DEADLINE, MAX_RESPONSE_BYTES, LineSplitter, bounded_lines, clamp_client, deadline, read_body
from .commands import Commands, RunFn, StopFn
from .file_results import file_bytes, range_fields, read_bytes_hint
from .process_handles import ProcessHandle, started_pid
from .remote_async import AsyncRemoteSandbox
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
    iter_events,
    reply_error,
    result_from,
    run_deadline_message,
)


class RemoteFiles:
    """Workspace file operations of one RemoteSandbox (paths relative to the workspace)."""

    def __init__(self, sandbox: RemoteSandbox) -> None:
        self._sb = sandbox

    def read(self, path: str, offset: int = 0, limit: int = 2000) -> TextPage:
        """Lines ``offset`` .. ``offset+limit`` of a text file of any size; a binary file is a
        ``NotTextError`` (read it with ``read_bytes``)."""
        try:
            out = self._sb._post("read", self._sb._req.scoped(path=path, offset=offset, limit=limit))
        except NotTextError as e:
            raise read_bytes_hint(e, path) from None
        return decode("a text page", lambda: TextPage(**out))

    def read_bytes(self, path: str, offset: int | None = None, length: int | None = None) -> FileBytes:
        """A file's bytes (at most 64 MiB, else 413), or ``length`` bytes (at most 64 MiB) from
        ``offset``; ``total_size`` on the result is the file's size, to fetch a larger one in pieces."""
        out = self._sb._post("read_binary", self._sb._req.scoped(path=path, **range_fields(offset, length)))
        return decode("file content", lambda: file_bytes(out))

    def write(self, path: str, content: str | bytes, mode: str = "overwrite") -> FileInfo:
        out = self._sb._post("write", self._sb._req.scoped(path=path, mode=mode, **_content(content)))
        return decode("file info", lambda: FileInfo(**out))

    def write_many(self, files: dict[str, str | bytes]) -> list[FileInfo]:
        sb = self._sb
        tenant = sb.tenant_id or sb._whoami_tenant()
        body = {"files": [{"path": p, **_content(c)} for p, c in files.items()]}
        out = sb._post(f"sessions/{tenant}/{sb.session_id}/copy", body)
        return decode("a file list", lambda: [FileInfo(**f) for f in out["files"]])

    def list(self, path: str = ".", recursive: bool = False) -> list[FileInfo]:
        out = self._sb._post("list", self._sb._req.scoped(path=path, recursive=recursive))
        return decode("a file list", lambda: [FileInfo(**f) for f in out["files"]])

    def glob(self, pattern: str, max_results: int | None = None) -> GlobResult:
        """Matching paths, at most ``max_results`` (the server's default: 1000); ``truncated`` on
        the result when more matched."""
        extra = {} if max_results is None else {"max_results": max_results}
        out = self._sb._post("glob", self._sb._req.scoped(pattern=pattern, **extra))
        return decode("a path list", lambda: GlobResult.from_dict(out))

    def grep(self, pattern: str, path: str = ".", glob: str | None = None, max_results: int = 100
             ) -> GrepResult:
        """Matching lines, at most ``max_results``; on the result ``truncated``, ``binary_matches`` and
        ``skipped`` (models.GrepResult)."""
        out = self._sb._post("grep", self._sb._req.scoped(pattern=pattern, path=path, glob=glob,
                                                          max_results=max_results))
        return decode("a match list", lambda: GrepResult.from_dict(out))

    def delete(self, path: str) -> None:
        """Remove a file, or a directory and what it holds (a symlink itself, never its target)."""
        self._sb._post("delete", self._sb._req.scoped(path=path))

    def mkdir(self, path: str) -> bool:
        """Make a directory and its parents; False when it was one already."""
        out = self._sb._post("mkdir", self._sb._req.scoped(path=path))
        return decode("a mkdir answer", lambda: bool(out["created"]))

    def move(self, source: str, destination: str) -> str:
        """Rename or move within the workspace, as ``mv``; where it is now."""
        out = self._sb._post("move", self._sb._req.scoped(source=source, destination=destination))
        return decode("a move answer", lambda: _str(out["path"]))


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value


class RemoteSandbox:
    """A session on an execbox service: workspace and contexts persist until ``close()``.

    ``tenant_id`` defaults to the token's tenant; ``session_id`` to a fresh random id.
    ``close()`` destroys the session (``POST sessions/{tenant}/{session}/close``, allowed to the
    tenant's own tokens), so its slot of SANDBOX_TENANT_MAX_SESSIONS is free again at once.

    Every exchange has a wall-clock deadline (a run: its timeout + 30 s, or 3600 s + 30 s when it
    names none; other calls: 300 s), past which a run is SB005 and a call SB003, and no reply body
    or streamed event larger than ``max_response_bytes`` is buffered (SB003). ``display_name``
    replaces the URL in error messages and details (self_managed: tenants must not see it).
    """

    def __init__(self, url: str, token: str | None = None, *, tenant_id: str | None = None,
                 session_id: str | None = None, http_client: httpx.Client | None = None,
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
        self._http = clamp_client(http_client or httpx.Client(base_url=self.url, headers=_headers(token),
                                                              timeout=DEFAULT_HTTP_TIMEOUT))
        self.closed = False
        self._no_processes = False  # the service said it has no background processes (then: held runs)
        self.files = RemoteFiles(self)
        self.commands = Commands(self)

    @classmethod
    def create(cls, url: str, token: str | None = None, *, tenant_id: str | None = None,
               session_id: str | None = None) -> RemoteSandbox:
        return cls(url, token, tenant_id=tenant_id, session_id=session_id)

    # -- transport --------------------------------------------------------------------------
    def _send(self, method: str, path: str, body: dict[str, Any] | None = None, *,
              seconds: float | None = None, timed_out: tuple[type[SandboxError], str] | None = None) -> Reply:
        """One exchange, read whole within ``seconds`` of wall-clock time. ``timed_out``: the error a
        run (or install) past it raises; such a server is silent until done, so reads may wait that long."""
        self._check_open()
        seconds = seconds or CALL_DEADLINE  # looked up per call (tests shorten it)
        error, message = timed_out or (
            ConnectionFailedError, f"{self._where} did not finish answering within {seconds:g}s; gave up")
        with deadline(seconds, error, message) as dl:
            try:
                with self._http.stream(method, f"{API_PREFIX}/{path}", json=body,
                                       timeout=seconds if timed_out else min(seconds, DEFAULT_HTTP_TIMEOUT)) as r:
                    content = read_body(r, self.max_response_bytes, dl, "the service's answer")
                    return Reply(r.status_code, content, r.request.url.path)
            except httpx.HTTPError as e:
                raise self._transport_error(dl, e, "cannot reach") from e

    def _check_open(self) -> None:
        if self.closed:
            raise closed_error("RemoteSandbox", self.session_id)

    def _transport_error(self, dl: Any, e: httpx.HTTPError, doing: str) -> SandboxError:
        if dl.expired:
            return dl.failure()
        why = (f"{type(e).__name__}: {redact_url_credentials(str(e))}" if self._where_details
               else type(e).__name__)  # display_name: no URL
        return ConnectionFailedError(f"{doing} {self._where}: {why}", details=dict(self._where_details))

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self._send("POST", path, body)
        if r.status >= 300:
            raise reply_error(r)
        return r.obj()

    def _whoami_tenant(self) -> str:
        """The token's tenant (the copy route names it in its path)."""
        r = self._send("GET", "whoami")
        if r.status >= 300:
            raise reply_error(r)
        self.tenant_id = decode("whoami", lambda: _str(r.obj()["tenant_id"]))
        return self.tenant_id

    def _fetcher(self, path: str) -> bytes:
        return self.files.read_bytes(path)

    # -- execution --------------------------------------------------------------------------
    def _run(self, op: str, body: dict[str, Any], timeout: float | None,
             on_output: OutputCallback | None, cut: threading.Event | None = None) -> ExecutionResult:
        self._check_open()
        seconds = self._req.http_timeout(timeout)
        if on_output is None:
            r = self._send("POST", op, body, seconds=seconds,
                           timed_out=(ExecutionTimeoutError, run_deadline_message(self._where, timeout)))
            if r.status >= 300:
                return _result_or_raise(reply_error(r), self._fetcher)
            return result_from(r.obj(), self._fetcher)
        state = _StreamState(on_output)
        parser = _SSE(self.max_response_bytes)
        limit = self.max_response_bytes
        with deadline(seconds, ExecutionTimeoutError, run_deadline_message(self._where, timeout)) as dl:
            try:
                with self._http.stream("POST", f"{API_PREFIX}/{op}", json={**body, "stream": True},
                                       timeout=seconds) as r:
                    if r.status_code >= 300:
                        reply = Reply(r.status_code, read_body(r, limit, dl, "the service's answer"),
                                      r.request.url.path)
                        return _result_or_raise(reply_error(reply), self._fetcher)
                    lines = LineSplitter(limit, 2 * limit, "the event stream")
                    for line in bounded_lines(r.iter_text(), lines, dl):  # a keepalive every second
                        if cut is not None and cut.is_set():  # kill(): leaving closes the stream; the
                            raise ConnectionFailedError("the command was killed")  # service cancels the run
                        item = parser.feed(line)
                        if item is not None:
                            state.handle(*item)
            except httpx.HTTPError as e:
                raise self._transport_error(dl, e, "the stream broke from") from e
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

    def _command_parts(self, command: str, timeout: float | None, cwd: str | None,
                       env: dict[str, str] | None) -> tuple[RunFn, StopFn]:
        cut = threading.Event()

        def run(out: OutputCallback) -> ExecutionResult:
            body = self._req.scoped(command=command, timeout=timeout, cwd=cwd, env=env)
            return self._run("bash", body, timeout, out, cut)

        return run, cut.set

    # -- background processes (docs/http-api.md, "Background processes") ----------------------
    def _processes_path(self, suffix: str = "") -> str:
        tenant = self.tenant_id or self._whoami_tenant()
        return f"sessions/{tenant}/{self.session_id}/processes{suffix}"

    def _start_process(self, command: str, timeout: float | None, cwd: str | None, env: dict[str, str] | None,
                       on_output: OutputCallback | None, stdin: bool) -> ProcessHandle | None:
        """``commands.run(background=True)``: a background process of the session; None when the
        service has none (its provider, or an older service): the command then runs as a held run."""
        if self._no_processes:
            return None
        body = {"command": command, "cwd": cwd, "env": env, "stdin": stdin, "timeout": timeout}
        pid = started_pid(self._send("POST", self._processes_path(), body), stdin)
        if pid is None:
            self._no_processes = True
            return None
        return ProcessHandle(self, pid, on_output)

    def _process_read(self, pid: int, stdout_offset: int, stderr_offset: int, wait: float) -> dict[str, Any]:
        query = f"?stdout_offset={stdout_offset}&stderr_offset={stderr_offset}&wait={wait:g}"
        r = self._send("GET", self._processes_path(f"/{pid}{query}"), seconds=wait + HTTP_GRACE)
        if r.status >= 300:
            raise reply_error(r)
        return r.obj()

    def _process_post(self, pid: int, what: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._post(self._processes_path(f"/{pid}/{what}"), body)

    # -- lifecycle --------------------------------------------------------------------------
    # -- session state (docs/sessions.md) ----------------------------------------------------
    def _session_call(self, method: str, suffix: str = "") -> dict[str, Any]:
        tenant = self.tenant_id or self._whoami_tenant()
        r = self._send(method, f"sessions/{tenant}/{self.session_id}{suffix}")
        if r.status >= 300:
            raise reply_error(r)
        return r.obj()

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
        seconds = (timeout or 300) + HTTP_GRACE
        r = self._send("POST", f"sessions/{tenant}/{self.session_id}/install", body, seconds=seconds,
                       timed_out=(ExecutionTimeoutError, f"{self._where} did not finish the install within "
                                                         f"{seconds:g}s; gave up"))
        if r.status >= 300:
            raise reply_error(r)
        return r.obj()

    def interrupt(self) -> bool:
        """Interrupt the run the session is serving, started from this object (on another thread)
        or by any other client: it ends as cancelled, a context's cell with its state kept, as a
        notebook's interrupt. False when nothing was running."""
        tenant = self.tenant_id or self._whoami_tenant()
        out = self._post(f"sessions/{tenant}/{self.session_id}/interrupt", {})
        return decode("an interrupt answer", lambda: bool(out["interrupted"]))

    def close(self) -> None:
        """End the session: ``POST sessions/{tenant}/{session}/close`` stops what runs in it and
        deletes its box and workspace (any token of the tenant may; it frees a slot of
        SANDBOX_TENANT_MAX_SESSIONS at once). A session never used (404) has nothing to end; a
        service that cannot be reached leaves it to the idle reaper. Using the object afterwards
        raises SandboxClosedError (SB002)."""
        if self.closed:
            return
        try:
            tenant = self.tenant_id or self._whoami_tenant()
            self._send("POST", f"sessions/{tenant}/{self.session_id}/close", seconds=10)
        except (SandboxError, ValueError):
            pass  # unreachable, or the session is gone: nothing to end here (close() must not mask an error)
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
