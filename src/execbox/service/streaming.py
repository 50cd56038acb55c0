"""Server-sent events: bridge a blocking run on a worker thread to a text/event-stream response.

The run emits (event, data) pairs from its thread; the response yields them as they come. If
the client goes away before the run finished, the run is cancelled (the agent kills the process
tree) and cancellation is retried until the worker returns, so a disconnect never leaves a run
holding its session.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from ..errors import SandboxError
from ..providers.base import SandboxProvider

log = logging.getLogger("execbox.service.streaming")

KEEPALIVE_SECONDS = 1.0
CANCEL_RETRY_SECONDS = 0.05
CANCEL_GIVE_UP_SECONDS = 60.0

Emit = Callable[[str, Any], None]


def sse(event: str, data: Any) -> bytes:
    """One SSE frame; data is JSON on a single line (json.dumps never emits a newline)."""
    return f"event: {event}\ndata: {json.dumps(data, default=str)}\n\n".encode()


def wants_stream(accept: str | None, flag: bool) -> bool:
    return flag or "text/event-stream" in (accept or "").lower()


class RunHandle:
    """Shared between the HTTP side and the worker: which instance runs, and whether to stop it."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self._target: tuple[SandboxProvider, str] | None = None
        self._lock = threading.Lock()

    def started(self, provider: SandboxProvider, instance_id: str) -> None:
        with self._lock:
            self._target = (provider, instance_id)
        if self.cancelled.is_set():
            self._poke()

    def finished(self) -> None:
        """The run left its box: from now on a poke must not reach the next run in that session."""
        with self._lock:
            self._target = None

    def _poke(self) -> None:
        with self._lock:  # held across cancel(): finished() cannot slip in between
            if self._target is not None:
                try:
                    self._target[0].cancel(self._target[1])
                except SandboxError:
                    pass

    def cancel(self) -> None:
        """Stop the run; keep asking until the worker returns (the request may not have reached the box)."""
        if self.cancelled.is_set():
            return
        self.cancelled.set()

        def keep_cancelling() -> None:
            give_up = time.monotonic() + CANCEL_GIVE_UP_SECONDS
            while not self.done.is_set() and time.monotonic() < give_up:
                self._poke()
                self.done.wait(CANCEL_RETRY_SECONDS)

        threading.Thread(target=keep_cancelling, name="execbox-cancel", daemon=True).start()


def stream_run(run: Callable[[Emit, RunHandle], None]) -> StreamingResponse:
    """Run ``run(emit, handle)`` on a thread and stream what it emits as SSE."""
    handle = RunHandle()
    return StreamingResponse(_events(run, handle), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _events(run: Callable[[Emit, RunHandle], None], handle: RunHandle) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue()

    def put(item: tuple[str, Any] | None) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # loop closed: the server is shutting down
            handle.cancel()

    def worker() -> None:
        try:
            run(lambda event, data: put((event, data)), handle)
        except SandboxError as e:
            put(("error", e.to_dict()["error"]))
        except BaseException:
            log.exception("streamed run failed unexpectedly")
            put(("error", {"code": "SB000", "message": "internal error while streaming", "details": {}}))
        finally:
            handle.done.set()
            put(None)

    # on a copy of the request's context: the session notes (sessions/notes.py) reach the run
    threading.Thread(target=contextvars.copy_context().run, args=(worker,), name="execbox-stream",
                     daemon=True).start()
    finished = False
    try:
        yield b": execbox stream\n\n"
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
            except TimeoutError:
                yield b": keepalive\n\n"  # a write to a closed connection is how disconnects surface
                continue
            if item is None:
                finished = True
                return
            yield sse(*item)
    finally:
        if not finished:
            handle.cancel()
