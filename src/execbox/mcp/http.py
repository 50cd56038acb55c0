"""Streamable HTTP at /mcp inside `execbox serve`, authenticated by execbox bearer tokens.

The token's tenant scopes every tool call. A handshake-era client's Mcp-Session-Id maps to one
execbox session, closed when the client ends the MCP session (DELETE) or it idles out; a
sessionless (2026-07-28) client gets one default session per token.
"""

from __future__ import annotations

import json
import os
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio.to_thread
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from ..errors import SandboxError
from ..service.auth import AuthError, authenticate
from ..service.container import Services
from ..settings import parse_duration
from .core import DEFAULT_MAX_TIMEOUT, Caller, ServiceCore
from .server import build_server

PRINCIPAL = "execbox.principal"
SESSION_HEADER = b"mcp-session-id"


def max_timeout_from_env() -> float:
    raw = os.environ.get("EXECBOX_MCP_MAX_TIMEOUT", "")
    return parse_duration(raw, "EXECBOX_MCP_MAX_TIMEOUT") if raw else DEFAULT_MAX_TIMEOUT


class McpHttpApp:
    """ASGI app: bearer auth, then the MCP SDK's streamable HTTP session manager."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self._core: ServiceCore | None = None
        self.server = build_server(self._resolve)
        self.manager = StreamableHTTPSessionManager(app=self.server, json_response=False,
                                                    session_idle_timeout=services.settings.idle_timeout)

    @property
    def core(self) -> ServiceCore:
        """Built on first use (EXECBOX_MCP_MAX_TIMEOUT is read then)."""
        if self._core is None:
            s = self.services.settings
            self._core = ServiceCore(self.services.sessions, self.services.runs, s.default_timeout,
                                     max_timeout_from_env(), s.max_code_bytes)
        return self._core

    def lifespan(self) -> AbstractAsyncContextManager[None]:
        return self.manager.run()

    def _resolve(self, ctx: Any) -> tuple[ServiceCore, Caller, str]:
        request = getattr(ctx, "request", None)
        principal = request.scope.get(PRINCIPAL) if request is not None else None
        if principal is None:
            raise AuthError("missing bearer token")
        session = request.headers.get("mcp-session-id")
        key = f"mcp:{principal.tenant_id}:{session}" if session else f"token:{principal.token_id}"
        return self.core, Caller(principal.tenant_id, principal.token_id), key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            principal = authenticate(Request(scope), self.services.store)
        except SandboxError as e:
            await _json(send, e.http_status, e.to_dict(),
                        [(b"www-authenticate", b'Bearer realm="execbox"')] if e.http_status == 401 else [])
            return
        scope[PRINCIPAL] = principal
        if scope["method"] == "DELETE":  # the client ends its MCP session: close the execbox session first
            session = dict(scope.get("headers") or []).get(SESSION_HEADER)
            if session:
                await anyio.to_thread.run_sync(self.core.end_implicit, f"mcp:{principal.tenant_id}:{session.decode()}",
                                               principal.tenant_id)
        await self.manager.handle_request(scope, receive, send)


async def _json(send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode()), *headers]})
    await send({"type": "http.response.body", "body": payload})
