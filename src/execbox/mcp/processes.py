"""Background processes for the MCP tools: the HTTP API's processes, on the same process table.

The steps are the HTTP routes' own (``service/process_ops.py``: start, list, find, stdin,
signal), on the same replica's ``ProcessTable``, so a process started through MCP is listed and
readable through the HTTP API and the other way round. The in-box agent runs the process; nothing
here runs code. Nothing here knows MCP.

What differs is the reader: a tool call runs in a worker thread, so a long-poll waits on the
process's condition instead of an event loop, and one read returns at most ``limit`` bytes of each
stream (the model's output cap), cut on a character boundary, with the offsets to read on from.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import TYPE_CHECKING, Any

from ..errors import InvalidConfigError
from ..service.background import READ_CHUNK, BgProcess, ProcessTable
from ..service.bg_stream import partial_utf8
from ..service.process_ops import MAX_STDIN_BYTES, ProcessOps
from ..service.routes.processes import MAX_WAIT
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


def _ops(core: ServiceCore) -> ProcessOps:
    return ProcessOps(core.sessions, core.runs, _table(core))


def start(core: ServiceCore, caller: Caller, session_id: str, command: str, cwd: str | None,
          env: dict[str, str] | None, stdin: bool, timeout: float | None) -> BgProcess:
    """Start ``bash -c command`` in the session's box, followed and audited as the HTTP route does."""
    core.check_code(command, "command")
    return _ops(core).start(caller.tenant_id, session_id, caller.token_id, command, cwd, env, stdin, timeout)


def listing(core: ServiceCore, caller: Caller, session_id: str) -> list[BgProcess]:
    """The session's processes: running ones and recently ended ones (never creating the session)."""
    return _ops(core).listing(caller.tenant_id, session_id)


def find(core: ServiceCore, caller: Caller, session_id: str, pid: int) -> BgProcess:
    """The session's process whose public id (``pid``, not always ``box_pid``) is ``pid``; 404
    naming ``pid`` for one it does not have."""
    return _ops(core).find(caller.tenant_id, session_id, pid)


def read(proc: BgProcess, stdout_offset: int, stderr_offset: int, wait: float, limit: int) -> dict[str, Any]:
    """Output past the offsets (at most ``limit`` bytes per stream, whole characters; ``limit`` 0:
    the HTTP API's 1 MiB) decoded as UTF-8, the offsets to read on from, how many bytes already wait
    past them, and the process's state (``exited_in_box`` once the box reported it over while its
    output still waits there: ``*_waiting`` then counts what the box holds too). Waits up to ``wait``
    s for new output or the end when there is none."""
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
        final = proc.box_sizes if not proc.ended else None  # over in the box: what it holds still counts
        for i, (name, stream) in enumerate((("stdout", proc.out), ("stderr", proc.err))):
            data: bytes = got[name]
            nxt = int(got[f"{name}_offset"])
            if nxt < stream.end:  # cut by the limit: a character cut in two waits for the next read
                cut = partial_utf8(data)
                data, nxt = data[:len(data) - cut], nxt - cut
            out[name] = data.decode("utf-8", "replace")
            out[f"{name}_offset"] = nxt
            out[f"{name}_skipped"] = got[f"{name}_skipped"]
            out[f"{name}_dropped"] = got.get(f"{name}_dropped", 0)
            out[f"{name}_waiting"] = max(0, max(stream.end, final[i] if final else 0) - nxt)
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
    proc = _ops(core).write_input(caller.tenant_id, session_id, caller.token_id, pid, raw, close)
    return {"pid": pid, "written": len(raw), "stdin": proc.info()["stdin"]}


def signal(core: ServiceCore, caller: Caller, session_id: str, pid: int, sig: str,
           wait: float = END_WAIT) -> tuple[BgProcess, bool]:
    """Send ``sig`` to the process's job, then wait up to ``wait`` s for it to end; (the process,
    whether a signal was delivered: False for one that had already ended)."""
    proc, signalled = _ops(core).signal(caller.tenant_id, session_id, caller.token_id, pid, sig)
    deadline = time.monotonic() + wait
    with proc.cond:
        while not proc.ended and (left := deadline - time.monotonic()) > 0:
            proc.cond.wait(left)
    return proc, signalled
