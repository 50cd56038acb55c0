"""Exception handlers and the body-size guard: every failure leaves as {"error": {code, message, details}}.

SandboxError -> its own status; validation errors -> 400 SB002 naming the field; unknown routes
and methods -> 404/405 in the same shape; a body over the limit -> 413 before it is parsed.
Anything else is a bug: logged with its traceback, answered 500 SB000 without internals.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy import exc as sqlalchemy_exc
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import PayloadTooLargeError, SandboxError
from .container import services
from .metrics import ServiceMetrics

log = logging.getLogger("execbox.service.errors")


def error_response(code: str, message: str, status: int, details: dict[str, Any] | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, "details": details or {}}},
                        status_code=status, headers=headers)


def _count(request: Request, code: str) -> None:
    services(request).metrics.errors.labels(code).inc()


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


async def sandbox_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SandboxError)
    _count(request, exc.code)
    status = exc.http_status if 400 <= exc.http_status <= 599 else 500
    headers = _retry_after(exc) if status in (429, 503) else None
    owner_url = getattr(exc, "forward_to", None)  # SessionOwnedElsewhere only, never wire details
    if owner_url:  # another replica owns the session: the forwarding middleware takes it there
        headers = {**(headers or {}), "x-execbox-forward-to": str(owner_url)}
    body = exc.to_dict()
    trace = body["error"]["details"].pop("traceback", None)  # internals stay in the server log
    if status >= 500 or trace:
        log.warning("%s answered %s: %s", request.url.path, status, exc.message,
                    extra={"fields": {"code": exc.code, "path": request.url.path, "traceback": trace}})
    return JSONResponse(body, status_code=status, headers=headers)


def _retry_after(exc: SandboxError) -> dict[str, str] | None:
    """``Retry-After``: what the error knows (``retry_after``: seconds, or None when retrying
    alone cannot succeed, e.g. a tenant at its session quota with every session in use), else 1."""
    wait = getattr(exc, "retry_after", 1)
    return None if wait is None else {"Retry-After": str(max(1, int(wait)))}


JSON_BODY = "a JSON object body is expected (Content-Type: application/json)"


def _problem(err: dict[str, Any], content_type: str) -> dict[str, str]:
    """One validation error as {field, message, type}. A body that is not JSON names the field
    ``body`` (pydantic's location is a byte offset) with the position in the message; a body that
    is not an object (text/plain, a JSON list) says that a JSON object is expected."""
    loc = tuple(err.get("loc", ()))
    kind = str(err.get("type", ""))
    message = str(err.get("msg", ""))
    if kind == "json_invalid":
        where = f" at byte {loc[1]}" if len(loc) > 1 and isinstance(loc[1], int) else ""
        why = (err.get("ctx") or {}).get("error")
        return {"field": "body", "type": kind,
                "message": f"not valid JSON{where}" + (f" ({why})" if why else "") + f"; {JSON_BODY}"}
    if loc == ("body",) and kind in ("model_attributes_type", "dict_type", "missing"):
        got = f", got Content-Type {content_type!r}" if content_type and "json" not in content_type else ""
        return {"field": "body", "type": kind, "message": f"{JSON_BODY}{got}"}
    return {"field": _field(loc), "message": message, "type": kind}


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    # Never echo "input": it may hold code, file contents or env values.
    problems = [_problem(err, content_type) for err in exc.errors()]
    first = problems[0] if problems else {"field": "body", "message": "invalid request"}
    _count(request, "SB002")
    return error_response("SB002", f"invalid request: {first['field']}: {first['message']}", 400,
                          {"field": first["field"], "errors": problems})


async def http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    _count(request, "SB002")
    message = str(exc.detail) if exc.detail else "request failed"
    headers = dict(exc.headers) if exc.headers else None
    return error_response("SB002", message, exc.status_code, {"path": request.url.path}, headers)


async def database_error(request: Request, exc: Exception) -> JSONResponse:
    """The store's database did not answer (down, partitioned, out of connections): a 503 the
    caller may retry, not a 500 that reads like a bug. The driver's text stays in the log (it
    can name hosts and users)."""
    log.warning("database unavailable on %s %s: %s", request.method, request.url.path, type(exc).__name__)
    _count(request, "SB009")
    return error_response("SB009", "the service's database is unavailable; retry shortly", 503,
                          headers={"Retry-After": "1"})


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    _count(request, "SB000")
    return error_response("SB000", "internal error; the server log has the details", 500)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(SandboxError, sandbox_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    for cls in (OperationalError, InterfaceError, sqlalchemy_exc.TimeoutError):  # connection-level only
        app.add_exception_handler(cls, database_error)
    app.add_exception_handler(Exception, unexpected_error)


class BodyTooLarge(StarletteHTTPException):
    """Raised from ``receive`` once the counted body passes the limit. FastAPI routes answer it
    through ``http_error`` (413 SB002); apps mounted beside them (the E2B sandbox router, Connect
    services) may catch it by class, and whatever lets it escape gets BodyLimit's own 413."""

    def __init__(self, message: str) -> None:
        super().__init__(413, message)


ADMIN_BODY_BYTES = 1024 * 1024
ADMIN_BODY_LIMITS = {"/api/admin/": ADMIN_BODY_BYTES}
"""BodyLimit's ``limits`` for execbox's app: the admin API's bodies are a provider configuration or
a token name (a few KiB), so they stop at 1 MiB, not at SANDBOX_MAX_REQUEST_BYTES (review 47, F3)."""


class BodyLimit:
    """ASGI middleware: refuse bodies over ``max_bytes`` with 413 (declared length or counted stream).

    The outermost middleware (app.py): every route, the E2B sandbox URL included, is bounded.
    Before answering 413 it reads and discards the rest of a body of at most ``DRAIN_FACTOR``
    times the limit (within ``DRAIN_SECONDS``): a client still writing it (the E2B SDK uploading a
    file over the limit) then reads the 413 instead of a connection reset. Nothing is kept, so
    memory stays bounded; a larger body is refused at once and the connection closed.
    """

    DRAIN_FACTOR = 4
    DRAIN_SECONDS = 15.0

    def __init__(self, app: ASGIApp, max_bytes: int, metrics: ServiceMetrics,
                 shapes: dict[str, Callable[[PayloadTooLargeError], Response]] | None = None,
                 limits: dict[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.shapes = shapes or {}
        """Path -> the 413 answer in that route's own shape (RAGFlow's /run: executor_compat.too_large);
        every other path gets the one error shape."""
        self.limits = limits or {}
        """Path prefix -> a smaller limit for the paths under it (ADMIN_BODY_LIMITS)."""

    def limit_for(self, path: str) -> int:
        return min([self.max_bytes, *(n for prefix, n in self.limits.items() if path.startswith(prefix))])

    def _too_large(self, limit: int | None = None, path: str = "") -> PayloadTooLargeError:
        limit = self.max_bytes if limit is None else limit
        where = next((f" for {prefix}* routes" for prefix, n in self.limits.items()
                      if path.startswith(prefix) and n == limit and n < self.max_bytes), "")
        return PayloadTooLargeError(f"request body exceeds the limit of {limit} bytes{where}",
                                    details={"field": "body", "limit": limit})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value) if len(value) <= 20 else limit + 1
                except ValueError:
                    declared = 0
                if declared > limit:
                    if declared <= self.DRAIN_FACTOR * limit:
                        await self._drain(receive, declared)
                    await self._reject(scope, receive, send, limit)
                    return
        seen = 0
        started = False
        ended = False

        async def counted() -> Message:
            nonlocal seen, ended
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                ended = not message.get("more_body")
                if seen > limit:  # FastAPI passes HTTPException through body parsing
                    raise BodyTooLarge(self._too_large(limit, scope.get("path", "")).message)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge:
            if started:  # a streamed answer already began: nothing more can be said
                return
            if not ended:
                await self._drain(receive, self.DRAIN_FACTOR * limit - seen)
            await self._reject(scope, receive, send, limit)

    async def _drain(self, receive: Receive, budget: int) -> None:
        """Read and drop the body's rest, up to ``budget`` bytes and ``DRAIN_SECONDS``."""
        async def drain() -> None:
            left = budget
            while left >= 0:
                message = await receive()
                if message["type"] != "http.request":
                    return
                left -= len(message.get("body", b""))
                if not message.get("more_body"):
                    return

        try:
            await asyncio.wait_for(drain(), self.DRAIN_SECONDS)
        except TimeoutError:
            pass

    async def _reject(self, scope: Scope, receive: Receive, send: Send, limit: int | None = None) -> None:
        err = self._too_large(limit, scope.get("path", ""))
        shape = self.shapes.get(scope.get("path", ""))
        response = shape(err) if shape is not None else JSONResponse(err.to_dict(), status_code=413)
        response.headers["Connection"] = "close"
        self.metrics.errors.labels(err.code).inc()
        await response(scope, receive, send)
