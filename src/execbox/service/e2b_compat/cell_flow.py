"""How a code-interpreter cell's request flows, beside what it runs (interpreter.py): its turn
among the sandbox's cells (``Turns``), a refusal before its stream starts (``refusal``: an HTTP
error), and a stream broken off on purpose (``CellStream``, ``BrokenOff``) when the request failed
for a reason that is not the cell's code, so the SDK raises instead of reporting an error the
code never raised (interpreter.py's module docstring says which failure goes which way)."""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from starlette.responses import Response, StreamingResponse
from starlette.types import Send

from ...errors import SandboxError, SessionNotFoundError
from ...providers.base import SandboxProvider
from ..streaming import RunHandle
from .registry import E2BSandbox
from .sandbox_http import clip, envd_error

TURN_RECHECK = 1.0
"""Seconds between looks at whether the sandbox still exists, for a cell waiting its turn."""


class CellHandle(RunHandle):
    """A running cell: RunHandle (cancel it, wait for it) plus why it was stopped, if it was."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped_by: str | None = None  # "restarted" / "removed": its context was, meanwhile
        self.reached_box = False
        """The run service gave it its box: from here a failure may have cut the cell's code short."""
        self.on_start: Callable[[], None] | None = None
        self.on_cancel: Callable[[], None] | None = None

    def started(self, provider: SandboxProvider, instance_id: str) -> None:
        super().started(provider, instance_id)
        self.reached_box = True
        if self.on_start is not None:
            self.on_start()

    def cancel(self) -> None:
        super().cancel()
        if self.on_cancel is not None:
            self.on_cancel()  # a cell waiting its turn stops waiting


class _Queue:
    def __init__(self) -> None:
        self.cells: deque[CellHandle] = deque()
        self.cond = threading.Condition()


class Turns:
    """Each sandbox's cells, one at a time, in the order they came: a cell waits here, holding
    nothing of the service's (no tenant slot, no session request), until the cell before it is
    done, as a kernel queues executions. execbox runs one program per session at a time anyway."""

    def __init__(self) -> None:
        self._queues: dict[str, _Queue] = {}
        self._lock = threading.Lock()

    def take(self, key: str, handle: CellHandle, on_wait: Callable[[], None], alive: Callable[[], bool]) -> bool:
        """Wait for ``handle``'s turn (True), or give up (False) when it is cancelled or the
        sandbox is gone. ``on_wait`` is called once when it has to wait."""
        with self._lock:
            q = self._queues.setdefault(key, _Queue())
            with q.cond:
                q.cells.append(handle)
                if q.cells[0] is handle:
                    return True

        def wake() -> None:
            with q.cond:
                q.cond.notify_all()

        handle.on_cancel = wake
        on_wait()
        looked = time.monotonic()
        while True:
            with q.cond:
                if q.cells[0] is not handle and not handle.cancelled.is_set():
                    q.cond.wait(TURN_RECHECK)
                first = q.cells[0] is handle
            if handle.cancelled.is_set():
                self.release(key, handle)
                return False
            if first or time.monotonic() - looked >= TURN_RECHECK:
                looked = time.monotonic()
                if not alive():  # killed or timed out meanwhile: never a fresh session for it
                    self.release(key, handle)
                    return False
                if first:
                    return True

    def release(self, key: str, handle: CellHandle) -> None:
        """``handle`` is done (or gave up): the next cell's turn."""
        with self._lock:
            q = self._queues.get(key)
            if q is None:
                return
            with q.cond:
                try:
                    q.cells.remove(handle)
                except ValueError:
                    pass
                if not q.cells:
                    del self._queues[key]
                q.cond.notify_all()


class Refused:
    """The cell was refused before it ran: answered with this HTTP error instead of a stream."""

    def __init__(self, response: Response) -> None:
        self.response = response


GO = object()
"""The stream may start: the cell reached its box, or waits its turn (as E2B answers at once)."""
BREAK = object()
"""The stream ends without its end: the request failed (the SDK raises)."""


class BrokenOff(Exception):
    """Raised by a cell's stream: end it without its last chunk."""


class CutOff(Exception):
    """The service cut the cell off (its sandbox was killed or timed out; the replica drains)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_broken_on_purpose: contextvars.ContextVar[bool] = contextvars.ContextVar("execbox_e2b_cell_broken", default=False)
_UNFINISHED = "ASGI callable returned without completing response."


class _QuietBrokenCells(logging.Filter):
    """uvicorn logs an ERROR for a response left unfinished; a cell's stream broken off on purpose
    (its own log line says why) is not one: the record is dropped in that request's context only."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_broken_on_purpose.get() and record.msg == _UNFINISHED)


QUIET_BROKEN = _QuietBrokenCells()


class CellStream(StreamingResponse):
    """A cell's NDJSON lines. A stream the service broke off (``BrokenOff``) ends without its last
    chunk: the server drops the connection, so the SDK raises (httpx's ``RemoteProtocolError``,
    undici's "terminated"; ``TimeoutException`` "the sandbox was killed ..." once the SDK finds
    the sandbox not running) instead of returning a result whose error the code never raised."""

    broken = False

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except BrokenOff:
            self.broken = True
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Any, receive: Any, send: Send) -> None:
        await super().__call__(scope, receive, send)
        if self.broken:  # (stream_response ran in a task of its own: its context is a copy)
            _broken_on_purpose.set(True)  # the server's task, which logs once this returns


CUT_OFF = {
    "destroyed": "the sandbox was killed or timed out while this cell ran",
    "draining": "the server is shutting down; this cell was stopped",
    "fenced": "this sandbox is now served by another replica; this cell was stopped",
}


def refusal(sb: E2BSandbox, e: SandboxError) -> Response:
    """The HTTP answer to a cell refused before it ran: the error's own status (SB008 429,
    SB009 / SB004 503), or E2B's 502 for a sandbox whose session is gone."""
    if isinstance(e, SessionNotFoundError):
        return envd_error(502, f"The sandbox {clip(sb.sandbox_id)} was not found (killed or timed out)")
    return envd_error(e.http_status, f"{e.code}: {e.message}")
