"""Streamable HTTP at /mcp inside `execbox serve`, authenticated by execbox bearer tokens.

The token's tenant scopes every tool call. A handshake-era client's Mcp-Session-Id maps to one
execbox session, closed when the client ends the MCP session (DELETE) or it idles out; a
sessionless (2026-07-28) client gets one default session per token.

An Mcp-Session-Id belongs to the principal (tenant and token) whose initialize request opened it:
any other token presenting it gets 404, exactly as for an unknown session, on every method.
"""

from __future__ import annotations

import json
import os
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio.to_thread
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from ..errors import SandboxError
from ..service.auth import AuthError, Principal, authenticate
from ..service.container import Services
from ..settings import parse_duration
from .core import DEFAULT_MAX_TIMEOUT, Caller, ServiceCore
from .output_cap import max_output_from_env
from .server import build_server

PRINCIPAL = "execbox.principal"
SESSION_HEADER = b"mcp-session-id"
NOT_FOUND = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Session not found"}}
"""The SDK's answer to an unknown Mcp-Session-Id, given to a principal that does not own the session."""

Owner = tuple[str, str]
"""(tenant id, token id): who opened an MCP session."""


def max_timeout_from_env() -> float:
    raw = os.environ.get("EXECBOX_MCP_MAX_TIMEOUT", "")
    return parse_duration(raw, "EXECBOX_MCP_MAX_TIMEOUT") if raw else DEFAULT_MAX_TIMEOUT


class McpHttpApp:
    """ASGI app: bearer auth, then the MCP SDK's streamable HTTP session manager."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.max_output = max_output_from_env()  # read at start: a bad value stops `execbox serve` (SB002)
        self._core: ServiceCore | None = None
        self.server = build_server(self._resolve)
        self.manager = StreamableHTTPSessionManager(app=self.server, json_response=False,
                                                    session_idle_timeout=services.settings.idle_timeout)
        self._owners: dict[str, Owner] = {}  # Mcp-Session-Id -> the principal whose initialize opened it

    @property
    def core(self) -> ServiceCore:
        """Built on first use (EXECBOX_MCP_MAX_TIMEOUT is read then)."""
        if self._core is None:
            s = self.services.settings
            self._core = ServiceCore(self.services.sessions, self.services.runs, s.default_timeout,
                                     max_timeout_from_env(), s.max_code_bytes, self.max_output)
        return self._core

    def lifespan(self) -> AbstractAsyncContextManager[None]:
        return self.manager.run()

    def _resolve(self, ctx: Any) -> tuple[ServiceCore, Caller, str]:
        request = getattr(ctx, "request", None)
        principal = request.scope.get(PRINCIPAL) if request is not None else None
        if principal is None:
            raise AuthError("missing bearer token")
        session = request.headers.get("mcp-session-id")
        key = _implicit_key(principal, session) if session else f"token:{principal.token_id}"
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
        # the first header, as the SDK and Starlette read it (a second one must not pass the check)
        raw = next((v for k, v in scope.get("headers") or [] if k == SESSION_HEADER), None)
        if raw is None:  # no MCP session yet: an initialize opens one, owned by this principal
            await self.manager.handle_request(scope, receive, self._recording(principal, send))
            return
        session = raw.decode("latin-1")
        if self._owners.get(session) != _owner(principal):
            await _json(send, 404, NOT_FOUND, [])  # another principal's session, or none: as if unknown
            return
        if scope["method"] == "DELETE":
            send = self._ending(principal, session, send)
        await self.manager.handle_request(scope, receive, send)

    def _recording(self, principal: Principal, send: Send) -> Send:
        """``send``, noting the principal as owner of the Mcp-Session-Id an initialize answer carries."""
        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                issued = dict(message.get("headers") or []).get(SESSION_HEADER)
                if issued:
                    self._forget_ended()
                    self._owners[issued.decode("latin-1")] = _owner(principal)
            await send(message)
        return wrapped

    def _ending(self, principal: Principal, session: str, send: Send) -> Send:
        """``send`` for the owner's DELETE: once the SDK accepts it, close the execbox session the
        MCP session used before the client hears back, and forget the owner."""
        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                self._owners.pop(session, None)
                await anyio.to_thread.run_sync(self.core.end_implicit, _implicit_key(principal, session),
                                               principal.tenant_id)
            await send(message)
        return wrapped

    def _forget_ended(self) -> None:
        """Drop owners of MCP sessions the SDK no longer holds (idled out, crashed)."""
        live = getattr(self.manager, "_server_instances", None)
        if isinstance(live, dict):
            for session in [s for s in self._owners if s not in live]:
                self._owners.pop(session, None)


def _owner(principal: Principal) -> Owner:
    return principal.tenant_id, principal.token_id


def _implicit_key(principal: Principal, session: str) -> str:
    return f"mcp:{principal.tenant_id}:{principal.token_id}:{session}"


async def _json(send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode()), *headers]})
    await send({"type": "http.response.body", "body": payload})
