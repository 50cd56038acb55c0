"""A non-streamed run whose client goes away is cancelled, as a streamed one is.

A streamed run sees a disconnect when a write fails (streaming.py). A plain ``execute`` or
``bash`` request writes nothing until its run ends, so nothing noticed its client leaving: the run
held its session, its box and one of the tenant's execution slots until its timeout, and a client
that gave up and retried met 429 SB008. This ASGI middleware listens, on those routes and once the
request's body is read, for the server's ``http.disconnect``; the route hangs its run's cancel
(``RunHandle.cancel``) on the request's :class:`Disconnect`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

STATE_KEY = "execbox_disconnect"
RUN_PATHS = ("/execute", "/bash")  # /v1/sandbox/... and the direct routes


class Disconnect:
    """Whether the request's client went away, and what to do when it does (from any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gone = False
        self._then: list[Callable[[], None]] = []

    def fire(self) -> None:
        with self._lock:
            self._gone, then, self._then = True, self._then, []
        for call in then:
            call()

    def on_gone(self, call: Callable[[], None]) -> None:
        with self._lock:
            if not self._gone:
                self._then.append(call)
                return
        call()


def of(scope: Scope) -> Disconnect | None:
    """The request's Disconnect, where the middleware set one."""
    return scope.get("state", {}).get(STATE_KEY)


class CancelOnDisconnect:
    """ASGI middleware: a Disconnect for each run request, fired when its client goes away."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or not scope["path"].endswith(RUN_PATHS):
            await self.app(scope, receive, send)
            return
        gone = Disconnect()
        scope.setdefault("state", {})[STATE_KEY] = gone
        listener: asyncio.Task[None] | None = None

        async def listen() -> None:  # after the body: only a disconnect can come
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.fire()

        async def receive_and_note() -> Message:
            nonlocal listener
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.fire()
            elif not message.get("more_body") and listener is None:
                listener = asyncio.get_running_loop().create_task(listen())
            return message

        try:
            await self.app(scope, receive_and_note, send)
        finally:
            if listener is not None:
                listener.cancel()
