"""The token gate: a token-authenticated route's token is checked before its body is read.

FastAPI parses a route's body before it resolves ``Depends(require_token)``, and ForwardToOwner
buffers every body first: without this gate anyone could make the service read and parse
SANDBOX_MAX_REQUEST_BYTES (64 MiB) per request, with no token at all (review 47, F3). Here the
token is verified (the same ``store.tokens.verify`` auth.py uses, one lookup per request: the
route reuses the record through the request's scope) from the headers alone, and a request
without a valid one is answered 401 at once, its body unread.

Which paths (:func:`scheme_for`): every route that takes execbox's bearer tokens; RAGFlow's
``/run`` as its ExecutorAuth says (nothing with ``--open-run`` or on loopback, its static
``--token``, else execbox tokens: executor_compat.authorize itself, answering in its shape); the
E2B control plane (``/sandboxes``, ``/v2/sandboxes``), whose token comes as ``X-API-Key`` (or
bearer), answering in E2B's error shape. Left alone: ``/healthz``, ``/readyz``, ``/metrics`` (no
token), ``/mcp`` (checks its token before reading the body itself), the console's static files
and the OpenAPI document; and the E2B sandbox URL (requests with E2B's routing headers), which
SandboxRouter answers outside this gate with its per-sandbox access tokens.

A role is not checked here (a tenant token on an admin route still reaches the route's 403), nor
is anything else: the gate only keeps bodies of unauthenticated requests from being read.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio.to_thread
from sqlalchemy import exc as sqlalchemy_exc
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import SandboxError
from .auth import VERIFIED, authenticate, bearer_value, verify_token
from .routes.executor_compat import authorize
from .token_paths import E2B_UNAUTHORIZED, scheme_for

log = logging.getLogger("execbox.service.auth")
DATABASE_DOWN = (sqlalchemy_exc.OperationalError, sqlalchemy_exc.InterfaceError, sqlalchemy_exc.TimeoutError)
"""Connection-level store failures (errors.install_error_handlers answers the same ones 503)."""

def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers") or []:
        if k == name:
            return v.decode("latin-1")
    return None


def _has_body(scope: Scope) -> bool:
    length = _header(scope, b"content-length")
    return _header(scope, b"transfer-encoding") is not None or (length is not None and length.strip() not in ("", "0"))


class TokenGate:
    """ASGI middleware (app.py, inside SandboxRouter, outside ForwardToOwner): see the module."""

    def __init__(self, app: ASGIApp, services: Any) -> None:
        self.app = app
        self.services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scheme_for(scope.get("path", "")) if scope["type"] == "http" else None
        if kind is None:
            await self.app(scope, receive, send)
            return
        try:
            await anyio.to_thread.run_sync(self._check, kind, scope)  # the store may be asked: off the loop
        except SandboxError as e:
            await self._refuse(kind, e, scope, receive, send)
            return
        except DATABASE_DOWN as e:  # answered here, the body unread: a degraded service is no time to buffer it
            log.warning("token gate: the database is unavailable (%s)", type(e).__name__)
            await self._unavailable(kind, scope, receive, send)
            return
        except Exception as e:  # noqa: BLE001 - anything else: the route's own check answers it
            log.debug("token gate: verification failed (%s); leaving it to the route", type(e).__name__)
        await self.app(scope, receive, send)

    def _check(self, kind: str, scope: Scope) -> None:
        """Raise the route's own AuthError unless the request's token is good; a verified token
        is left in the scope (auth.VERIFIED), so the route does not ask the store again."""
        if kind == "bearer":
            authenticate(Request(scope), self.services.store)
        elif kind == "run":
            if getattr(scope["app"].state, "executor", None) is not None:
                authorize(Request(scope))
        else:
            token = _header(scope, b"x-api-key") or bearer_value(_header(scope, b"authorization") or "")
            scope[VERIFIED] = (token, verify_token(token, self.services.store))

    async def _unavailable(self, kind: str, scope: Scope, receive: Receive, send: Send) -> None:
        """503 SB009 with Retry-After, as errors.database_error answers a route (E2B's shape on its API)."""
        message = "the service's database is unavailable; retry shortly"
        body = {"code": 503, "message": message} if kind == "e2b" else \
            {"error": {"code": "SB009", "message": message, "details": {}}}
        response = JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
        self.services.metrics.errors.labels("SB009").inc()
        if _has_body(scope):
            response.headers["Connection"] = "close"
        await response(scope, receive, send)

    async def _refuse(self, kind: str, error: SandboxError, scope: Scope, receive: Receive, send: Send) -> None:
        if kind == "e2b":
            response = JSONResponse({"code": 401, "message": E2B_UNAUTHORIZED}, status_code=401)
        else:  # as the routes answer it: the service's error shape (/run adds WWW-Authenticate)
            response = JSONResponse(error.to_dict(), status_code=error.http_status,
                                    headers={"WWW-Authenticate": "Bearer"} if kind == "run" else None)
            self.services.metrics.errors.labels(error.code).inc()
        if _has_body(scope):  # unread: the connection cannot carry another request
            response.headers["Connection"] = "close"
        await response(scope, receive, send)


__all__ = ["TokenGate", "scheme_for"]
