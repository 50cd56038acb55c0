"""The sandbox URL (E2B_SANDBOX_URL): envd's HTTP routes, the code interpreter, Connect services.

Every request carries ``E2b-Sandbox-Id`` (and ``E2b-Sandbox-Port``: 49983 envd, 49999 code
interpreter) and the per-sandbox access token from create/connect (``X-Access-Token`` or
``E2B-Traffic-Access-Token``). ``route_sandbox_requests`` wraps the whole app and sends such
requests here, so the SDK can use one URL for every sandbox; all other requests reach execbox's
own API untouched. A sandbox whose creating execbox token was revoked answers 401 here too
(checked against the store at most every few seconds per token: creator.py).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...errors import SandboxError
from ..sessions import notes
from ..sessions.model import SessionOwnedElsewhere
from . import forward
from .registry import E2BSandbox, Registry

log = logging.getLogger("execbox.service.e2b")

ASGIApp = Callable[[dict[str, Any], Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]]

ENVD_PORT = 49983
JUPYTER_PORT = 49999
_HOST = re.compile(r"^([0-9]{1,5})-([a-z0-9]{1,64})\.")
_PORT = re.compile(r"[0-9]{1,5}")
ECHO_MAX = 64


def clip(value: object, limit: int = ECHO_MAX) -> str:
    """``value`` as echoed in an error message: at most ``limit`` characters, then an ellipsis."""
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "\u2026"


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k.lower() == name:
            return v.decode("latin-1")
    return None


def sandbox_of(scope: dict[str, Any], domain: str | None) -> tuple[str, int] | None:
    """(sandbox id, port) from E2B's routing headers, or from a `{port}-{id}.{domain}` host name
    when a sandbox domain is configured (EXECBOX_E2B_DOMAIN; off by default, so no other host name
    is ever taken for a sandbox)."""
    sid = _header(scope, b"e2b-sandbox-id")
    if sid:
        port = _header(scope, b"e2b-sandbox-port") or str(ENVD_PORT)
        return sid, int(port) if _PORT.fullmatch(port) else -1  # never int() of 5,000 digits
    if domain:
        host = (_header(scope, b"host") or "").split(":")[0].lower()
        m = _HOST.match(host)
        if m and host[m.end():] == domain:
            return m.group(2), int(m.group(1))
    return None


def envd_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


async def _send_response(resp: Response, scope: dict[str, Any], receive: Any, send: Any) -> None:
    await resp(scope, receive, send)


class SandboxRouter:
    """ASGI middleware: requests addressed to an E2B sandbox go to its envd/interpreter handlers."""

    def __init__(self, app: ASGIApp, registry: Registry,
                 envd: Callable[[E2BSandbox, dict[str, Any]], ASGIApp | None],
                 jupyter: Callable[[E2BSandbox, dict[str, Any]], ASGIApp | None]) -> None:
        self.app = app
        self.domain = (os.environ.get("EXECBOX_E2B_DOMAIN") or "").strip().lower().strip(".") or None
        self.registry = registry
        self.envd = envd
        self.jupyter = jupyter

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        target = sandbox_of(scope, self.domain) if scope["type"] == "http" else None
        if target is None:
            await self.app(scope, receive, send)
            return
        sid, port = target
        marker = forward.forwarded_here(scope)
        sb, owner = await anyio.to_thread.run_sync(self._lookup, sid, marker is None)  # may read the store
        if sb is None:  # E2B's edge answers 502 "The sandbox X was not found" for a sandbox that is gone;
            # the Python SDK raises SandboxNotRunningException only on those words (else "state unknown")
            await _send_response(envd_error(502, f"The sandbox {clip(sid)} was not found (killed or timed out)"),
                                 scope, receive, send)
            return
        token = _header(scope, b"x-access-token") or _header(scope, b"e2b-traffic-access-token")
        if not sb.token_ok(token):
            await _send_response(envd_error(401, "missing or wrong sandbox access token"), scope, receive, send)
            return
        refused = await self._creator_refused(sb)
        if refused is not None:
            await _send_response(refused, scope, receive, send)
            return
        if marker is False:
            await _send_response(envd_error(403, "invalid internal forwarding signature"), scope, receive, send)
            return
        if owner:
            await forward.relay(owner, self.registry.sessions.replica, scope, receive, send)
            return
        handler = (self.envd if port == ENVD_PORT else self.jupyter if port == JUPYTER_PORT else None)
        app = handler(sb, scope) if handler is not None else None
        if app is None:
            await _send_response(envd_error(404, f"nothing listens on port {port} of sandbox {clip(sid)} "
                                                 f"(execbox serves envd {ENVD_PORT} and the code "
                                                 f"interpreter {JUPYTER_PORT})"), scope, receive, send)
            return
        with notes.recreating_dead_boxes():  # the SDKs have no "box died, made again on next use"
            await app(scope, receive, send)

    def _lookup(self, sid: str, may_forward: bool) -> tuple[E2BSandbox | None, str | None]:
        """In one thread hop: the sandbox, and the URL of the live replica that owns its session
        when that is not this one and the request may go there (forward.py; not for a request a
        replica forwarded already: it is served here, whatever comes)."""
        sb = self.registry.get(sid)
        if sb is None or not may_forward:
            return sb, None
        try:
            self.registry.sessions.check_owner(sb.tenant_id, sb.session_id)
        except SessionOwnedElsewhere as e:
            return sb, (e.forward_to if forward.can_forward(e.forward_to) else None)
        except SandboxError:  # the registry cannot say now: the handler's own session use decides
            pass
        return sb, None

    async def _creator_refused(self, sb: E2BSandbox) -> Response | None:
        """401 when the execbox token that created the sandbox was revoked (503 when the store
        cannot say); None when it is valid. The cached answer spares a thread hop."""
        valid = self.registry.creator_cached(sb)
        if valid is None:
            try:
                valid = await anyio.to_thread.run_sync(self.registry.creator_valid, sb)
            except Exception as e:  # noqa: BLE001 - fail closed, but say it may pass on a retry
                log.warning("checking the API token of e2b sandbox %s failed (%s)", sb.sandbox_id,
                            type(e).__name__)
                log.debug("token check failure", exc_info=True)
                return envd_error(503, "could not check the API key that created this sandbox; try again")
        if valid:
            return None
        return envd_error(401, "the API key that created this sandbox was revoked; the sandbox is being killed")


class TooLarge(ValueError):
    """A request body over the service's limit (413)."""


async def read_capped(request: Request, limit: int) -> bytes:
    """The body, refused as soon as it passes ``limit`` bytes (a tighter limit than BodyLimit's
    max_request_bytes, such as max_file_bytes for an upload)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"request body is larger than the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes) -> Any:
    """``json.loads`` whose every failure (malformed, nested past the parser's recursion limit)
    is a ValueError naming the problem."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("request body is nested too deeply") from None
    except ValueError:
        raise ValueError("request body is not valid JSON") from None


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    body = parse_json(await read_capped(request, limit) or b"{}")
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    return body
