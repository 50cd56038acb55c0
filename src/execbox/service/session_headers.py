"""ASGI middleware: the session headers of every HTTP request (sessions/notes.py).

- Request ``X-Execbox-Create-Session: false``: a session the request names that does not exist is
  404 SB002 (``details.reason = "not_created"``) instead of being created on first use. ``true``
  (the default) keeps the gateway contract's "created on first use". Exactly ``true`` or
  ``false`` (any case); another value, or the header sent twice with different values, is 400.
- Response ``X-Execbox-Session-Created: true``: this request created the session it used (a new,
  empty workspace: the session of that id before, if any, has ended). Set on any answer, the
  error statuses of a run (408, 422) included; not on a streamed run (its 200 goes out before the
  session is resolved: its ``result`` event's ``metadata.session.created`` says it).

Implemented once, where sessions are resolved (SessionManager notes what it creates in the
request's context), so every route that names a session carries it, whichever it is.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_response
from .sessions import notes
from .sessions.manager import CREATE_HEADER

CREATED_HEADER = "X-Execbox-Session-Created"
_REQUEST = CREATE_HEADER.lower().encode()
_VALUES = {b"true": True, b"false": False}
REFUSAL = f"the request said {CREATE_HEADER}: false"


class SessionHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = {v.strip().lower() for k, v in scope.get("headers") or [] if k == _REQUEST}
        if len(sent) > 1 or not sent <= _VALUES.keys():
            why = "was sent more than once with different values" if len(sent) > 1 else "must be true or false"
            response = error_response("SB002", f"{CREATE_HEADER} {why}", 400, {"header": CREATE_HEADER})
            await response(scope, receive, send)
            return
        create = _VALUES[sent.pop()] if sent else True
        with notes.collecting(create=create, refusal=REFUSAL) as seen:
            async def marked(message: Message) -> None:
                if message["type"] == "http.response.start" and seen.created:
                    message = {**message, "headers": [*message.get("headers", []),
                                                      (CREATED_HEADER.lower().encode(), b"true")]}
                await send(message)

            await self.app(scope, receive, marked)
