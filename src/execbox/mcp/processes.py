"""Background processes for the MCP tools: the HTTP API's processes, on the same process table.

The same steps as ``service/routes/processes.py`` (start, list, read from byte offsets, stdin,
signal), on the same objects: the session manager's box for one operation, the replica's
``ProcessTable`` (so a process started through MCP is listed and readable through the HTTP API and
the other way round), the provider's agent calls and ``RunService.record`` for the audit rows. The
in-box agent runs the process; nothing here runs code. Nothing here knows MCP.

What differs is the reader: a tool call runs in a worker thread, so a long-poll waits on the
process's condition instead of an event loop, and one read returns at most ``limit`` bytes of each
stream (the model's output cap), cut on a character boundary, with the offsets to read on from.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import TYPE_CHECKING, Any

from ..errors import InvalidConfigError, PayloadTooLargeError, RateLimitError, SandboxError
from ..models import ExecutionResult
from ..providers.base import SandboxProvider
from ..service.background import OPERATION, READ_CHUNK, BgProcess, ProcessTable, supports
from ..service.bg_stream import partial_utf8
from ..service.executions import RunSpec
from ..service.routes.processes import MAX_STDIN_BYTES, MAX_WAIT, PROCESS_LANGUAGE
from ..service.routes.sandbox import check_path
from ..service.sessions import notes
from .output_cap import read_limit

if TYPE_CHECKING:
    from .core import Caller, ServiceCore

MAX_TIMEOUT = 86400.0
"""Longest ``timeout`` a background process may ask for, in seconds (the HTTP API's bound)."""
END_WAIT = 5.0
"""Seconds kill waits for the process to end, so its reply can say how it ended."""

__all__ = ["END_WAIT", "MAX_STDIN_BYTES", "MAX_TIMEOUT", "MAX_WAIT", "find", "listing", "read", "signal",
           "start", "write_input"]


def _table(core: ServiceCore) -> ProcessTable:
    if core.processes is None:
        raise InvalidConfigError("background processes are not available on this server", http_status=501,
                                 details={"reason": "background_processes_unsupported"})
    return core.processes


def _require_support(provider: SandboxProvider) -> None:
    if not supports(provider):
        raise InvalidConfigError(
            f"provider {provider.name!r} does not support background processes; they work on the "
            "self-hosted providers (jail, docker, kubernetes)", http_status=501,
            details={"provider": provider.name, "reason": "background_processes_unsupported"})


def _no_call(*_: Any) -> ExecutionResult:
    raise AssertionError("a process request runs no code")


def _record(core: ServiceCore, proc: BgProcess, operation: str, what: str, caller: Caller, started: float,
            status: str, error_code: str | None = None) -> None:
    spec = RunSpec(proc.tenant_id, proc.session_id, operation, PROCESS_LANGUAGE, what, caller.token_id, _no_call)
    core.runs.record(spec, proc.provider.name, proc.instance_id, started, status, None, error_code)


def start(core: ServiceCore, caller: Caller, session_id: str, command: str, cwd: str | None,
          env: dict[str, str] | None, stdin: bool, timeout: float | None) -> BgProcess:
    """Start ``bash -c command`` in the session's box, followed and audited as the HTTP route does."""
    core.check_code(command, "command")
    if not command.strip() or "\x00" in command:
        raise InvalidConfigError("command must be a non-empty string without NUL", details={"field": "command"})
    check_path(cwd, "cwd")
    table = _table(core)
    tenant = caller.tenant_id
    with core.sessions.execution_slot(tenant), \
            core.sessions.box_for_operation(tenant, session_id, "bash") as (provider, iid):
        _require_support(provider)
        limit = provider.config.get("max_timeout")
        if timeout is not None and limit and timeout > float(limit):
            raise InvalidConfigError(f"timeout {timeout:g}s exceeds this provider's maximum of {limit}s",
                                     details={"field": "timeout", "max": limit})
        cap = table.max_per_session
        if table.running(tenant, session_id, iid) >= cap:
            raise RateLimitError(f"too many background processes running in this session (max {cap}); "
                                 "wait for one to end or kill one first",
                                 details={"limit": cap, "reason": "max_background_processes"})
        spec = RunSpec(tenant, session_id, OPERATION, "bash", command, caller.token_id, _no_call)
        started = time.monotonic()
        where = None if cwd in (None, "", ".") else cwd
        try:
            pid = provider.start_process(iid, command, cwd=where, env=env, stdin=stdin)
        except SandboxError as e:
            core.runs.record(spec, provider.name, iid, started, "error", None, e.code)
            raise
        spec.inflight = core.runs.oplog.begin(
            tenant_id=tenant, session_id=session_id, provider=provider.name, operation=OPERATION,
            instance_id=iid, language="bash", code=command, token_id=caller.token_id)
        proc = BgProcess(pid, command, cwd, tenant, session_id, provider, iid, stdin, timeout, started_mono=started)
        table.add(proc, spec)
    return proc


def listing(core: ServiceCore, caller: Caller, session_id: str) -> list[BgProcess]:
    """The session's processes: running ones and recently ended ones (never creating the session)."""
    table = _table(core)
    with notes.collecting(create=False), \
            core.sessions.box_for_operation(caller.tenant_id, session_id, "bash") as (provider, iid):
        _require_support(provider)
        return table.of_box(caller.tenant_id, session_id, iid)


def find(core: ServiceCore, caller: Caller, session_id: str, pid: int) -> BgProcess:
    """The session's process ``pid``; SB002 naming ``pid`` for one it does not have."""
    table = _table(core)
    with notes.collecting(create=False), \
            core.sessions.box_for_operation(caller.tenant_id, session_id, "bash") as (provider, iid):
        _require_support(provider)
        proc = table.get(caller.tenant_id, session_id, iid, pid)
    if proc is None:
        raise InvalidConfigError(f"no background process {pid} in session {session_id}: list_processes shows "
                                 "its processes", http_status=404,
                                 details={"field": "pid", "pid": pid, "session_id": session_id})
    return proc


def read(proc: BgProcess, stdout_offset: int, stderr_offset: int, wait: float, limit: int) -> dict[str, Any]:
    """Output past the offsets (at most ``limit`` bytes per stream, whole characters; ``limit`` 0:
    the HTTP API's 1 MiB) decoded as UTF-8, the offsets to read on from, how many bytes already wait
    past them, and the process's state. Waits up to ``wait`` s for new output or the end when there
    is none."""
    limit = read_limit(limit, READ_CHUNK)
    deadline = time.monotonic() + min(max(wait, 0.0), MAX_WAIT)
    while True:
        got = proc.read(stdout_offset, stderr_offset, limit)
        left = deadline - time.monotonic()
        if got["stdout"] or got["stderr"] or proc.ended or left <= 0:
            break
        with proc.cond:  # the follower notifies it on new output and at the end
            if proc.version == got["version"] and not proc.ended:
                proc.cond.wait(left)
    out: dict[str, Any] = {}
    with proc.cond:
        for name, stream in (("stdout", proc.out), ("stderr", proc.err)):
            data: bytes = got[name]
            nxt = int(got[f"{name}_offset"])
            if nxt < stream.end:  # cut by the limit: a character cut in two waits for the next read
                cut = partial_utf8(data)
                data, nxt = data[:len(data) - cut], nxt - cut
            out[name] = data.decode("utf-8", "replace")
            out[f"{name}_offset"] = nxt
            out[f"{name}_skipped"] = got[f"{name}_skipped"]
            out[f"{name}_dropped"] = got.get(f"{name}_dropped", 0)
            out[f"{name}_waiting"] = max(0, stream.end - nxt)
    return {**proc.info(), **out}


def write_input(core: ServiceCore, caller: Caller, session_id: str, pid: int, data: str | None, encoding: str,
                close: bool) -> dict[str, Any]:
    """Write ``data`` (text, or base64 bytes) to the process's stdin and/or close it."""
    if data is None and not close:
        raise InvalidConfigError("give data (or close: true)", details={"field": "data"})
    raw = b""
    if data is not None and encoding == "base64":
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidConfigError("data is not valid base64", details={"field": "data"}) from None
    elif data is not None:
        raw = data.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_STDIN_BYTES:
        raise PayloadTooLargeError(f"stdin data is {len(raw)} bytes; the limit is {MAX_STDIN_BYTES} per call",
                                   details={"field": "data", "size": len(raw), "limit": MAX_STDIN_BYTES})
    with core.sessions.execution_slot(caller.tenant_id):
        proc = find(core, caller, session_id, pid)
        if not proc.info()["stdin"]:
            why = ("has ended" if proc.ended
                   else "takes no input: it was started without stdin=true, or its stdin was closed")
            raise InvalidConfigError(f"process {pid} {why}", http_status=409, details={"field": "pid", "pid": pid})
        started = time.monotonic()
        try:
            if raw:
                proc.provider.process_input(proc.instance_id, pid, raw)
            if close:
                proc.provider.close_process_input(proc.instance_id, pid)
                with proc.cond:
                    proc.stdin = False
        except SandboxError as e:
            _record(core, proc, "process_stdin", f"pid {pid}", caller, started, "error", e.code)
            if e.http_status == 404:  # it ended (and was read to its end) just now
                raise InvalidConfigError(f"process {pid} has ended", http_status=409,
                                         details={"field": "pid", "pid": pid}) from None
            raise
        _record(core, proc, "process_stdin", f"pid {pid}", caller, started, "success")
    return {"pid": pid, "written": len(raw), "stdin": proc.info()["stdin"]}


def signal(core: ServiceCore, caller: Caller, session_id: str, pid: int, sig: str,
           wait: float = END_WAIT) -> tuple[BgProcess, bool]:
    """Send ``sig`` to the process's job, then wait up to ``wait`` s for it to end; (the process,
    whether a signal was delivered: False for one that had already ended)."""
    with core.sessions.execution_slot(caller.tenant_id):
        proc = find(core, caller, session_id, pid)
        signalled = False
        started = time.monotonic()
        with proc.cond:
            over = proc.ended or proc.killed  # a SIGKILL was delivered: it is gone, its end not seen yet
        if not over:
            try:
                signalled = proc.provider.signal_process(proc.instance_id, pid, sig)
            except SandboxError as e:
                if e.http_status != 404:  # 404: it ended (and was read to its end) just now
                    _record(core, proc, "process_signal", f"{sig} pid {pid}", caller, started, "error", e.code)
                    raise
            if signalled and sig == "SIGKILL":
                with proc.cond:
                    proc.killed = True
        _record(core, proc, "process_signal", f"{sig} pid {pid}", caller, started, "success")
    deadline = time.monotonic() + wait
    with proc.cond:
        while not proc.ended and (left := deadline - time.monotonic()) > 0:
            proc.cond.wait(left)
    return proc, signalled
