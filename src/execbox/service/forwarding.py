"""Forwarding a request to the replica that owns its session, over an authenticated internal call.

A session's box lives in one replica (a jail box is its child process, a container its attach
stream). When another replica gets a request for it, the session manager raises
SessionOwnedElsewhere naming the owner's URL (from the registry's ``replicas`` table); this
middleware then replays the buffered request to that URL with the caller's own token (the owner
authenticates and authorises the caller as usual) plus ``X-Execbox-Forwarded``: an HMAC-SHA256
over replica, time, method, path and body with the shared EXECBOX_INTERNAL_SECRET. A forwarded
request is never forwarded again (no loops), and a forged or stale header is refused (403).
Streamed runs (server-sent events) are forwarded too: the route checks ownership before it
answers 200 (``SessionManager.check_owner``), and the owner's event stream is relayed chunk by
chunk as it comes; when the caller goes away the relay closes the owner's stream, which cancels
the run there.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import disconnect
from .config import internal_secret, replica_base_url
from .errors import error_response
from .forward_watch import OwnerWatch
from .streaming import sse
from .token_paths import scheme_for

log = logging.getLogger("execbox.service.forwarding")

HEADER = "x-execbox-forwarded"
TARGET = "x-execbox-forward-to"
MAX_SKEW = 60.0
HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", HEADER}


OWNER_LOST = ("the replica that owns this session stopped answering during the request; whether the "
              "request took effect is unknown (check the session before repeating it)")
OWNER_LOST_ERROR: dict[str, Any] = {"code": "SB009", "message": OWNER_LOST,
                                    "details": {"reason": "owner_lost_mid_request"}}


OWNER_LEASE_LOST = ("the replica that owns this session stopped answering during the request and its lease ran "
                    "out; whether the request took effect is unknown (check the session before repeating it; "
                    "another replica takes the session over now)")


async def _send_owner_lost(send: Send, lease_lost: bool = False) -> None:
    """503 SB009. Without Retry-After when the owner broke off: the request may have run, so blind
    retrying is not advised. With Retry-After when its lease ran out (``forward_watch.py``): the
    outcome is unknown all the same, but the session can be taken over at once."""
    if lease_lost:
        resp = error_response("SB009", OWNER_LEASE_LOST, 503, {"reason": "owner_lost_mid_request",
                                                                "lease_expired": True}, {"Retry-After": "1"})
    else:
        resp = error_response("SB009", OWNER_LOST, 503, {"reason": "owner_lost_mid_request"})
    await send({"type": "http.response.start", "status": resp.status_code, "headers": resp.raw_headers})
    await send({"type": "http.response.body", "body": resp.body, "more_body": False})


def owner_url(target: str, path: str, query: bytes = b"") -> httpx.URL | None:
    """``target``'s scheme, host and port with the request's path and query; None when the request
    target is not a plain absolute path (``*@host/x`` or ``//host/x`` would name another host)."""
    if not path.startswith("/") or path.startswith("//"):
        return None
    if any(part in (".", "..") for part in path.split("?", 1)[0].split("/")):
        return None  # the URL would drop them, and the path the marker signs would not match
    try:
        return httpx.URL(target).copy_with(raw_path=path.encode("latin-1") + (b"?" + query if query else b""))
    except (httpx.InvalidURL, UnicodeError):
        return None


def sign(secret: str, replica: str, stamp: str, method: str, path: str, body: bytes) -> str:
    msg = f"{replica}\n{stamp}\n{method}\n{path}\n{hashlib.sha256(body).hexdigest()}".encode()
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def verify(secret: str, header: str, method: str, path: str, body: bytes, now: float | None = None) -> bool:
    try:
        replica, stamp, mac = header.rsplit(":", 2)
        skew = abs((time.time() if now is None else now) - float(stamp))
    except ValueError:
        return False
    if skew > MAX_SKEW:
        return False
    return hmac.compare_digest(mac, sign(secret, replica, stamp, method, path, body))


NEVER_FORWARDED = frozenset({"/mcp"})
"""Paths whose answers never name another replica (MCP's tool errors are inside JSON-RPC replies), so
their bodies are not buffered here: /mcp reads its own, within its own smaller limit and time
(mcp/body_limit.py), which buffering here first would defeat (a stalled or 64 MiB body held)."""


class ForwardToOwner:
    """ASGI middleware: buffer the body, run the request here, and when the answer is "owned by
    replica X" (header x-execbox-forward-to), answer with X's response instead."""

    def __init__(self, app: ASGIApp, replica: str, secret: str | None = None, watch: OwnerWatch | None = None) -> None:
        self.app = app
        self.replica = replica
        self.secret = secret if secret is not None else internal_secret()
        self.watch = watch

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in NEVER_FORWARDED or scheme_for(scope["path"]) is None:
            # only a token route can answer "owned elsewhere", and its token was checked before
            # this (token_gate.py): no other body is held here (an unknown path's neither)
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            try:
                msg = await receive()
            except StarletteHTTPException as e:  # BodyLimit: the streamed body is over the limit
                resp = error_response("SB002", str(e.detail), e.status_code, {"path": scope["path"]},
                                      {"Connection": "close"})
                await resp(scope, receive, send)
                return
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        body = b"".join(chunks)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        method, path = scope["method"], scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        forwarded = headers.get(HEADER)
        if forwarded is not None and not (self.secret and verify(self.secret, forwarded, method, path, body)):
            resp = error_response("SB002", "invalid internal forwarding signature", 403, {"header": HEADER})
            await resp(scope, receive, send)
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        held: list[Message] = []
        target: str | None = None

        async def capture(message: Message) -> None:
            nonlocal target
            if message["type"] == "http.response.start":
                for k, v in message.get("headers", []):
                    if k.decode("latin-1").lower() == TARGET:
                        target = v.decode("latin-1")
                if target and forwarded is None:
                    held.append(message)
                    return
            if held:
                held.append(message)
                return
            await send(message)

        await self.app(scope, replay, capture)
        for m in held:  # where the owner lives is for the replicas, not for the caller
            if m["type"] == "http.response.start":
                m["headers"] = [(k, v) for k, v in m.get("headers", []) if k.decode("latin-1").lower() != TARGET]
        if not held or not target:
            for m in held:
                await send(m)
            return
        await self._forward(target, method, path, scope.get("query_string", b""), headers, body, receive, send,
                            held, disconnect.of(scope))

    async def _forward(self, target: str, method: str, path: str, query: bytes, headers: dict[str, str],
                       body: bytes, receive: Receive, send: Send, held: list[Message],
                       gone: disconnect.Disconnect | None = None) -> None:
        if not self.secret or not replica_base_url(target):
            for m in held:  # no shared secret: the owner's name and URL are in the error already
                await send(m)
            if self.secret:
                log.warning("not forwarding %s %s: the owner's registered URL %r is not a plain http(s) base URL",
                            method, path, target)
            return
        stamp = f"{time.time():.3f}"
        out = {k: v for k, v in headers.items() if k not in HOP_HEADERS}
        out[HEADER] = f"{self.replica}:{stamp}:{sign(self.secret, self.replica, stamp, method, path, body)}"
        url = owner_url(target, path, query)
        if url is None:
            for m in held:
                await send(m)
            return
        details = _details(held)
        if self.watch is None or details is None:
            await self._hop(target, method, path, url, body, out, receive, send, held, gone)
            return
        started: list[Message] = []

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                started.append(message)
            await send(message)

        hop = asyncio.ensure_future(self._hop(target, method, path, url, body, out, receive, tracked, held, gone))
        lost = asyncio.ensure_future(self.watch.lost(details))
        try:
            await asyncio.wait({hop, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            answered = hop.done()
            if not answered:
                hop.cancel()
            await asyncio.gather(hop, lost, return_exceptions=True)
        if answered:  # the hop ended first (or in the same instant): its own outcome stands
            if not hop.cancelled() and hop.exception() is not None:
                raise hop.exception()
            return
        if not started:
            await _send_owner_lost(send, lease_lost=True)
            return
        streamed = any(k.lower() == b"content-type" and b"text/event-stream" in v
                       for k, v in started[0].get("headers", []))
        if streamed:  # a relayed event stream: end it with the error event, as when the owner breaks off
            await send({"type": "http.response.body", "body": sse("error", OWNER_LOST_ERROR), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _hop(self, target: str, method: str, path: str, url: httpx.URL, body: bytes, out: dict[str, str],
                   receive: Receive, send: Send, held: list[Message], gone: disconnect.Disconnect | None) -> None:
        async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0, connect=5.0)) as client:
            try:
                resp = await _unless_gone(client.send(client.build_request(method, url, content=body, headers=out),
                                                      stream=True), gone)
                if resp is None:  # the caller left: the owner's connection is closed, its run cancelled
                    return
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:
                # nothing reached the owner (refused, or no answer to the connect): the held SB009 is the truth
                log.warning("forwarding %s %s to %s failed: %s", method, path, target, e)
                for m in held:
                    await send(m)
                return
            except httpx.HTTPError as e:  # the owner had the request and went away: outcome unknown
                log.warning("forwarding %s %s to %s broke off: %s", method, path, target, e)
                await _send_owner_lost(send)
                return
            try:
                skip = {"content-length", "transfer-encoding", "connection", "content-encoding"}
                hdrs: list[Any] = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in resp.headers.items()
                                   if k.lower() not in skip]
                hdrs.append((b"x-execbox-served-by", target.encode("latin-1")))
                if "text/event-stream" in resp.headers.get("content-type", ""):
                    await send({"type": "http.response.start", "status": resp.status_code, "headers": hdrs})
                    await _relay(resp, receive, send)
                    return
                content = await resp.aread()
                hdrs.append((b"content-length", str(len(content)).encode()))
                await send({"type": "http.response.start", "status": resp.status_code, "headers": hdrs})
                await send({"type": "http.response.body", "body": content, "more_body": False})
            finally:
                await resp.aclose()


def _details(held: list[Message]) -> dict[str, Any] | None:
    """The details of the held "served by replica" error (tenant, session, owner), for the watch."""
    try:
        body = b"".join(m.get("body", b"") for m in held if m["type"] == "http.response.body")
        details = json.loads(body)["error"]["details"]
    except (ValueError, KeyError, TypeError):
        return None
    return details if isinstance(details, dict) else None


async def _unless_gone(request: Awaitable[httpx.Response], gone: disconnect.Disconnect | None) -> httpx.Response | None:
    """The owner's answer, or None when the caller disconnects first (a plain run's answer comes
    only when the run ends): the request to the owner is then dropped, which closes its
    connection, and the owner's own disconnect.py cancels the run."""
    if gone is None:
        return await request
    loop = asyncio.get_running_loop()
    left: asyncio.Future[None] = loop.create_future()
    gone.on_gone(lambda: loop.call_soon_threadsafe(lambda: left.done() or left.set_result(None)))
    answer = asyncio.ensure_future(request)
    await asyncio.wait({answer, left}, return_when=asyncio.FIRST_COMPLETED)
    if answer.done():
        left.cancel()
        return answer.result()
    answer.cancel()
    try:
        await answer
    except BaseException:  # noqa: BLE001 - the dropped request's own end
        pass
    return None


async def _relay(resp: httpx.Response, receive: Receive, send: Send) -> None:
    """Pass an event stream on as it comes; stop (closing the owner's stream, which cancels its
    run) as soon as the caller disconnects."""

    async def pump() -> None:
        try:
            async for chunk in resp.aiter_bytes():  # decoded: content-encoding is not passed on
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as e:  # the owner went away mid-stream: say so, then end ours
            log.warning("forwarded stream from %s broke: %s", resp.url, e)
            await send({"type": "http.response.body", "body": sse("error", OWNER_LOST_ERROR), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    await until_caller_leaves(pump, receive)


async def until_caller_leaves(pump: Callable[[], Awaitable[None]], receive: Receive,
                              body_read: asyncio.Event | None = None) -> None:
    """Run ``pump()`` (which relays an answer) until it ends, or until the caller disconnects,
    which cancels it. ``body_read``: set once the request body is read (until then whoever reads
    it owns ``receive``)."""

    async def caller_gone() -> None:
        if body_read is not None:
            await body_read.wait()
        while (await receive())["type"] != "http.disconnect":
            pass

    tasks = [asyncio.ensure_future(pump()), asyncio.ensure_future(caller_gone())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if tasks[0].done() and not tasks[0].cancelled() and tasks[0].exception() is not None:
        raise tasks[0].exception()  # the relay broke: the caller must not take the answer as whole
