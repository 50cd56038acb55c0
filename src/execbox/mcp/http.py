"""Streamable HTTP at /mcp inside `execbox serve`, authenticated by execbox bearer tokens.

The token's tenant scopes every tool call. A handshake-era client's Mcp-Session-Id maps to one
execbox session, closed when the client ends the MCP session (DELETE) or it idles out; a
sessionless (2026-07-28) client gets one default session per token.

An Mcp-Session-Id belongs to the principal (tenant and token) whose initialize request opened it:
any other token presenting it gets 404, exactly as for an unknown session, on every method.

A token holds at most ``EXECBOX_MCP_MAX_SESSIONS`` (64) MCP sessions at once: an initialize past it
is refused with 429 SB008 and a Retry-After, never by ending another of its sessions (that would
take a live client's conversation, and its workspace, from under it). An MCP session that has not
made a tool call (or read a resource) ends after ``EXECBOX_MCP_UNUSED_SESSION_TIMEOUT`` (300 s)
without a request; one that has lives for ``SANDBOX_IDLE_TIMEOUT`` as before.

A POST body over ``EXECBOX_MCP_MAX_REQUEST_BYTES`` (4 MiB) is refused with a JSON-RPC 413 naming
the limit before the SDK reads it (body_limit.py); the SDK is given the same limit.
"""

from __future__ import annotations

import json
import math
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from ..errors import RateLimitError, SandboxError
from ..service.auth import AuthError, Principal, authenticate
from ..service.container import Services
from ..settings import env_duration, env_int
from .body_limit import declared_length, drain, max_request_bytes_from_env, read_bounded, refusal
from .core import DEFAULT_MAX_TIMEOUT, Caller, ServiceCore
from .output_cap import max_output_from_env
from .resource_cap import max_resource_bytes_from_env
from .server import build_server

PRINCIPAL = "execbox.principal"
SESSION_HEADER = b"mcp-session-id"
VERSION_HEADER = b"mcp-protocol-version"
MAX_SESSIONS_ENV = "EXECBOX_MCP_MAX_SESSIONS"
DEFAULT_MAX_SESSIONS = 64
"""MCP sessions one token may hold open at once (0: no cap)."""
UNUSED_TIMEOUT_ENV = "EXECBOX_MCP_UNUSED_SESSION_TIMEOUT"
DEFAULT_UNUSED_TIMEOUT = 300.0
"""Seconds without a request after which an MCP session that made no tool call ends."""
NOT_FOUND = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Session not found"}}
"""The SDK's answer to an unknown Mcp-Session-Id, given to a principal that does not own the session."""

Owner = tuple[str, str]
"""(tenant id, token id): who opened an MCP session."""


@dataclass
class _Live:
    """An MCP session the SDK holds: who opened it, and whether it has been used (a tool call)."""

    owner: Owner
    used: bool = False


@dataclass
class _Opening:
    """One request without Mcp-Session-Id: whether it is counted against its principal's cap while
    served, and the session its answer opened."""

    counted: bool = False
    issued: str | None = None


def max_timeout_from_env() -> float:
    return env_duration("EXECBOX_MCP_MAX_TIMEOUT", DEFAULT_MAX_TIMEOUT)


def max_sessions_from_env() -> int:
    """EXECBOX_MCP_MAX_SESSIONS (0: no cap), or the default; a bad value is SB002 naming it."""
    return env_int(MAX_SESSIONS_ENV, DEFAULT_MAX_SESSIONS)


def unused_timeout_from_env(idle_timeout: float) -> float:
    """EXECBOX_MCP_UNUSED_SESSION_TIMEOUT (a duration), or the default; never longer than the idle
    timeout of a used session. A bad value is SB002 naming it."""
    return min(env_duration(UNUSED_TIMEOUT_ENV, DEFAULT_UNUSED_TIMEOUT), idle_timeout)


class McpHttpApp:
    """ASGI app: bearer auth, then the MCP SDK's streamable HTTP session manager."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.max_output = max_output_from_env()  # read at start: a bad value stops `execbox serve` (SB002)
        self.max_resource_bytes = max_resource_bytes_from_env()
        self.max_sessions = max_sessions_from_env()
        self.unused_timeout = unused_timeout_from_env(services.settings.idle_timeout)
        self.max_request_bytes = max_request_bytes_from_env(services.settings.max_request_bytes)
        self._core: ServiceCore | None = None
        self.server = build_server(self._resolve)
        self.manager = StreamableHTTPSessionManager(app=self.server, json_response=False,
                                                    session_idle_timeout=services.settings.idle_timeout,
                                                    max_request_body_size=self.max_request_bytes)
        self._live: dict[str, _Live] = {}  # Mcp-Session-Id -> who opened it, whether it was used
        self._opening: dict[Owner, int] = {}  # initialize requests being served, per principal

    @property
    def core(self) -> ServiceCore:
        """Built on first use (EXECBOX_MCP_MAX_TIMEOUT is read then)."""
        if self._core is None:
            s = self.services.settings
            self._core = ServiceCore(self.services.sessions, self.services.runs, s.default_timeout,
                                     max_timeout_from_env(), s.max_code_bytes, self.max_output,
                                     self.services.processes,  # the HTTP API's background processes
                                     self.max_resource_bytes)
        return self._core

    def lifespan(self) -> AbstractAsyncContextManager[None]:
        return self.manager.run()

    def _resolve(self, ctx: Any) -> tuple[ServiceCore, Caller, str]:
        request = getattr(ctx, "request", None)
        principal = request.scope.get(PRINCIPAL) if request is not None else None
        if principal is None:
            raise AuthError("missing bearer token")
        session = request.headers.get("mcp-session-id")
        live = self._live.get(session) if session else None
        if live is not None:  # a tool call (or resource read): it lives for SANDBOX_IDLE_TIMEOUT from now on
            live.used = True
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
        body: bytes | None = None
        if scope["method"] == "POST":
            bounded = await self._within_limit(scope, receive, send)
            if bounded is None:
                return
            body, receive = bounded
        # the first header, as the SDK and Starlette read it (a second one must not pass the check)
        raw = next((v for k, v in scope.get("headers") or [] if k == SESSION_HEADER), None)
        if raw is None:  # no MCP session yet: an initialize opens one, owned by this principal
            await self._open(principal, scope, receive, send, body)
            return
        session = raw.decode("latin-1")
        live = self._live.get(session)
        if live is None or live.owner != _owner(principal):
            await _json(send, 404, NOT_FOUND, [])  # another principal's session, or none: as if unknown
            return
        if scope["method"] == "DELETE":
            send = self._ending(principal, session, send)
        await self.manager.handle_request(scope, receive, send)
        self._unused_expiry(session)

    async def _within_limit(self, scope: Scope, receive: Receive, send: Send) -> tuple[bytes, Receive] | None:
        """The POST body and a receive that replays it; or, past EXECBOX_MCP_MAX_REQUEST_BYTES
        (declared or counted), None once the 413 is sent."""
        limit = self.max_request_bytes
        declared = declared_length(scope.get("headers") or [])
        read = 0
        if declared is None or declared <= limit:
            body, read, replay = await read_bounded(receive, limit)
            if body is not None:
                return body, replay
        with anyio.move_on_after(15):  # let a client still sending read the answer, not a reset
            try:
                await drain(receive, 4 * limit - read)
            except Exception:  # noqa: BLE001 - past SANDBOX_MAX_REQUEST_BYTES too (its check raises): stop
                pass
        await _json(send, 413, refusal(limit, declared), [(b"connection", b"close")])
        return None

    async def _open(self, principal: Principal, scope: Scope, receive: Receive, send: Send,
                    body: bytes | None) -> None:
        """A request without Mcp-Session-Id (``body``: a POST's, already read). A handshake-era
        initialize (the only one that opens an MCP session) counts against the principal's
        EXECBOX_MCP_MAX_SESSIONS; past it, 429 SB008."""
        owner = _owner(principal)
        opening = _Opening()
        if scope["method"] == "POST" and _handshake_era(scope) and self.max_sessions > 0:
            if _is_initialize(body):
                self._forget_ended()
                held = sum(1 for live in self._live.values() if live.owner == owner) + self._opening.get(owner, 0)
                if held >= self.max_sessions:
                    err = self._full(owner)
                    wait = err.details.get("retry_after")
                    await _json(send, 429, err.to_dict(), [(b"retry-after", str(wait).encode())] if wait else [])
                    return
                self._opening[owner] = self._opening.get(owner, 0) + 1
                opening.counted = True
        try:
            await self.manager.handle_request(scope, receive, self._recording(principal, send, opening))
        finally:
            if opening.counted:  # refused or failed: no session was opened
                self._settle_opening(owner)
        if opening.issued:
            self._unused_expiry(opening.issued)

    def _settle_opening(self, owner: Owner) -> None:
        left = self._opening.get(owner, 0) - 1
        if left > 0:
            self._opening[owner] = left
        else:
            self._opening.pop(owner, None)

    def _full(self, owner: Owner) -> RateLimitError:
        """SB008 for a principal at its cap, with the seconds until its first session expires by
        itself (none, and no Retry-After, when every one has a request in flight)."""
        now = anyio.current_time()
        ends = [d for sid, live in self._live.items() if live.owner == owner
                for d in [self._deadline(sid)] if d is not None and math.isfinite(d)]
        wait = max(1, math.ceil(min(ends) - now)) if ends else None
        when = (f", or retry in about {wait} s, when the first of them expires unused or idle" if wait else
                "; every one of them has a request in flight now")
        return RateLimitError(
            f"this token holds its maximum of {self.max_sessions} open MCP sessions ({MAX_SESSIONS_ENV}): end "
            f"one it no longer needs (HTTP DELETE /mcp with its Mcp-Session-Id; MCP clients do so when they "
            f"close){when}", details={"reason": "mcp_sessions", "limit": self.max_sessions, "retry_after": wait})

    def _transport(self, session: str) -> Any:
        live = getattr(self.manager, "_server_instances", None)  # the SDK's open sessions
        return live.get(session) if isinstance(live, dict) else None

    def _deadline(self, session: str) -> float | None:
        """When the SDK ends the session for idleness (anyio clock; inf while a request is in flight)."""
        idle = getattr(self._transport(session), "idle_scope", None)
        return None if idle is None else float(idle.deadline)

    def _unused_expiry(self, session: str) -> None:
        """After a request: a session never used for a tool call ends EXECBOX_MCP_UNUSED_SESSION_TIMEOUT
        from now (the SDK set SANDBOX_IDLE_TIMEOUT; it waits while a request, a GET stream included,
        is in flight)."""
        live = self._live.get(session)
        idle = getattr(self._transport(session), "idle_scope", None)
        if live is None or live.used or idle is None or not math.isfinite(idle.deadline):
            return
        idle.deadline = min(idle.deadline, anyio.current_time() + self.unused_timeout)

    def _recording(self, principal: Principal, send: Send, opening: _Opening) -> Send:
        """``send``, noting the principal as owner of the Mcp-Session-Id an initialize answer carries."""
        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                found = dict(message.get("headers") or []).get(SESSION_HEADER)
                if found:
                    opening.issued = found.decode("latin-1")
                    self._forget_ended()
                    self._live[opening.issued] = _Live(_owner(principal))
                    if opening.counted:  # counted as open from now on, no longer as opening
                        opening.counted = False
                        self._settle_opening(_owner(principal))
            await send(message)
        return wrapped

    def _ending(self, principal: Principal, session: str, send: Send) -> Send:
        """``send`` for the owner's DELETE: once the SDK accepts it, close the execbox session the
        MCP session used before the client hears back, and forget the owner."""
        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                self._live.pop(session, None)
                await anyio.to_thread.run_sync(self.core.end_implicit, _implicit_key(principal, session),
                                               principal.tenant_id)
            await send(message)
        return wrapped

    def _forget_ended(self) -> None:
        """Drop MCP sessions the SDK no longer holds (idled out, unused, crashed)."""
        live = getattr(self.manager, "_server_instances", None)
        if isinstance(live, dict):
            for session in [s for s in self._live if s not in live]:
                self._live.pop(session, None)


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


def _handshake_era(scope: Scope) -> bool:
    """Whether the SDK serves this request on its handshake-era (session) path: no
    MCP-Protocol-Version header, or a handshake-era one (StreamableHTTPSessionManager's routing)."""
    raw = next((v for k, v in scope.get("headers") or [] if k == VERSION_HEADER), None)
    return raw is None or raw.decode("latin-1") in HANDSHAKE_PROTOCOL_VERSIONS


def _is_initialize(body: bytes | None) -> bool:
    """Whether a JSON-RPC body is (or, in a batch, holds) an ``initialize`` request."""
    if not body:
        return False
    try:
        message = json.loads(body)
    except ValueError:
        return False
    messages = message if isinstance(message, list) else [message]
    return any(isinstance(m, dict) and m.get("method") == "initialize" for m in messages)
