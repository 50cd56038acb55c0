"""The egress gateway's explicit forward proxy, for boxes that cannot be given redirect rules.

Kubernetes pods run with every capability dropped and on other nodes than the gateway, so the
iptables REDIRECT + synthetic DNS path of gateway.py is not available to them. Instead each pod's
environment names this proxy (``HTTP(S)_PROXY``) and proxy-aware clients send it:

* ``CONNECT host:port`` (HTTPS, or any TCP): ``200 Connection established``, then bytes are relayed;
* absolute-form plain HTTP (``GET http://host[:port]/path HTTP/1.1``): rewritten to origin form,
  ``Proxy-*``/``Connection``/``Keep-Alive`` dropped and ``Connection: close`` forced, so one proxied
  connection carries one request to one destination.

The box authenticates with ``Proxy-Authorization: Basic base64(<box>:<token>)``; ``token_for(box)``
says what the token must be (compared in constant time). Missing or bad credentials: 407. Then
``lookup(box)`` (blocking; run in a thread) gives the box's current policy and ids, and the
destination goes through the gateway's own decision (``gateway.decide``: names resolved here and
now, every address checked, always-denied ranges, per-box caps), is relayed by ``relay.splice``
and audited once per attempt. Denied: ``403`` with ``X-Execbox-Egress: denied`` and the reason.
Credential injection is not offered here (the kubernetes provider refuses ``network_credentials``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import ipaddress
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from . import audit
from .gateway import CONNECT_TIMEOUT, Limits, decide, gateway
from .policy import EgressPolicy
from .relay import splice

log = logging.getLogger("execbox.egress.proxy")

MAX_HEAD = 16384
HEAD_TIMEOUT = 10.0
MAX_CONNECTIONS = 4096  # open proxy connections, all boxes together (each box also has its own cap)
MAX_TRACKED = 10000  # per-box counters kept; idle ones are dropped past it
_HOST = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)(\.(?!-)[a-z0-9-]{1,63}(?<!-))*$")
_DROP = {"proxy-authorization", "proxy-connection", "proxy-authenticate", "connection", "keep-alive"}


class BadRequest(ValueError):
    """A request the proxy cannot serve (400), with a reason safe to show the box."""


@dataclass
class Grant:
    """What ``lookup`` says about a box: its current policy and the ids its audit records carry."""

    policy: EgressPolicy
    tenant_id: str | None = None
    session_id: str | None = None
    instance_id: str | None = None


@dataclass
class _BoxState:
    """Per-box counters on this proxy (the caps of gateway.Limits, per gateway replica)."""

    box: str
    limits: Limits
    policy: EgressPolicy = field(default_factory=EgressPolicy)
    active: int = 0
    bytes_total: int = 0


@dataclass
class Request:
    method: str
    host: str  # lower-case hostname or IPv4 literal
    port: int
    head: bytes = b""  # what goes upstream first (plain HTTP: the rewritten head; CONNECT: nothing)
    credentials: tuple[str, str] | None = None


def parse_credentials(value: str | None) -> tuple[str, str] | None:
    """``Basic base64(user:password)`` → (user, password); anything else → None."""
    if not value:
        return None
    scheme, _, raw = value.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        text = base64.b64decode(raw.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    user, sep, password = text.partition(":")
    return (user, password) if sep and user else None


def parse_target(authority: str, default_port: int | None) -> tuple[str, int]:
    """``host[:port]`` → (host, port); IPv6 and anything that is not a hostname/IPv4 is refused."""
    host, sep, port_text = authority.rpartition(":")
    if not sep or "]" in port_text:
        host, port_text = authority, ""
    if host.startswith("["):
        raise BadRequest("IPv6 destinations are not supported (IPv6 is denied)")
    if port_text:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise BadRequest(f"bad port in {authority[:100]!r}")
        port = int(port_text)
    elif default_port is not None:
        port = default_port
    else:
        raise BadRequest("CONNECT needs host:port")
    host = host.strip().lower().rstrip(".")
    if len(host) > 253 or not _HOST.match(host):
        raise BadRequest(f"{host[:100]!r} is not a hostname or IPv4 address")
    return host, port


def parse_request(head: bytes) -> Request:
    """Parse a request head (up to and including the blank line) into what the proxy needs."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError as e:  # pragma: no cover - latin-1 decodes anything
        raise BadRequest("undecodable request") from e
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest("not an HTTP/1.x request line")
    method, target, version = parts
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            break
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest("malformed header line")
        headers.append((name, value.strip()))
    auth = next((v for k, v in headers if k.lower() == "proxy-authorization"), None)
    creds = parse_credentials(auth)
    if method == "CONNECT":
        host, port = parse_target(target, None)
        return Request(method, host, port, b"", creds)
    url = urlsplit(target)
    if url.scheme != "http" or not url.netloc:
        raise BadRequest("only CONNECT and absolute-form http:// requests are proxied")
    if "@" in url.netloc:
        raise BadRequest("user info in the URL is not allowed")
    host, port = parse_target(url.netloc, 80)
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    # RFC 9112 3.2.2: a proxy replaces any received Host with the request-target's authority, so
    # the upstream sees the host the policy decided on, not another one sharing its address.
    out = [f"{method} {path} {version}", f"Host: {url.netloc}"]
    out += [f"{k}: {v}" for k, v in headers if k.lower() not in _DROP and k.lower() != "host"]
    out.append("Connection: close")
    return Request(method, host, port, ("\r\n".join(out) + "\r\n\r\n").encode("latin-1"), creds)


def _response(status: str, reason: str, extra: str = "") -> bytes:
    body = f"execbox egress {'denied' if status.startswith('403') else 'proxy'}: {reason}\n".encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n{extra}Connection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class _Conn(asyncio.Protocol):
    """Reads one request head, then pauses; the proxy takes the transport over from there."""

    def __init__(self, proxy: EgressProxy) -> None:
        self.proxy = proxy
        self.buf = b""
        self.head: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.proxy._spawn(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if b"\r\n\r\n" in self.buf or len(self.buf) > MAX_HEAD:
            assert self.transport is not None
            self.transport.pause_reading()
            if not self.head.done():
                self.head.set_result(self.buf)

    def eof_received(self) -> bool:
        if not self.head.done():
            self.head.set_result(self.buf)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.head.done():
            self.head.set_result(self.buf)


class EgressProxy:
    """One listening proxy on the gateway's event loop; ``start``/``stop`` from any thread."""

    def __init__(self, listen: tuple[str, int], token_for: Callable[[str], str],
                 lookup: Callable[[str], Grant | None], limits: Limits | None = None) -> None:
        self.listen = listen
        self.token_for = token_for
        self.lookup = lookup
        self.limits = limits or Limits.from_env()
        self._boxes: dict[str, _BoxState] = {}
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self.address: tuple[str, int] | None = None

    def start(self) -> tuple[str, int]:
        gw = gateway()
        self.address = asyncio.run_coroutine_threadsafe(self._start(), gw.loop).result(10)
        return self.address

    async def _start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Conn(self), self.listen[0], self.listen[1],
                                                reuse_address=True)
        return self._server.sockets[0].getsockname()[:2]

    def stop(self) -> None:
        if self._server is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), gateway().loop).result(10)
        except Exception:  # noqa: BLE001
            log.exception("egress proxy: stopping failed")

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        self._server = None
        for t in list(self._tasks):
            t.cancel()

    def _spawn(self, conn: _Conn) -> None:
        if len(self._tasks) >= MAX_CONNECTIONS:
            assert conn.transport is not None
            conn.transport.abort()
            return
        task = asyncio.get_running_loop().create_task(self._serve(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: _Conn) -> None:
        transport = conn.transport
        assert transport is not None
        started = time.monotonic()
        rec = audit.AuditRecord(box="?", kind="tcp", host=None, ip=None, port=None)
        state: _BoxState | None = None
        try:
            try:
                head = await asyncio.wait_for(conn.head, HEAD_TIMEOUT)
            except TimeoutError:
                head = b""
            end = head.find(b"\r\n\r\n")
            if end < 0:
                transport.close()  # nothing or no complete head: not a request, not audited
                return
            rest = head[end + 4:]
            try:
                req = parse_request(head[:end + 4])
            except BadRequest as e:
                rec.reason = f"bad request: {e}"
                transport.write(_response("400 Bad Request", str(e)))
                transport.close()
                audit.record(rec)
                return
            ip = _ip(req.host)
            rec.host, rec.ip, rec.port = (None if ip else req.host), (req.host if ip else None), req.port
            box = req.credentials[0] if req.credentials else None
            rec.box = (box or "?")[:253]
            if box is None or not hmac.compare_digest(req.credentials[1].encode(), self.token_for(box).encode()):
                rec.reason = "missing or bad proxy credentials"
                transport.write(_response("407 Proxy Authentication Required", rec.reason,
                                          'Proxy-Authenticate: Basic realm="execbox-egress"\r\n'))
                transport.close()
                return
            grant = await asyncio.get_running_loop().run_in_executor(None, self._lookup, box)
            if grant is None:  # gone, or not ours: forget its counters
                if box in self._boxes and not self._boxes[box].active:
                    del self._boxes[box]
                target, reason = None, "not a live box of this gateway"
            else:
                state = self._state(box)
                state.policy = grant.policy
                rec.tenant_id, rec.session_id = grant.tenant_id, grant.session_id
                state.active += 1
                target, reason = await decide(state, None if ip else req.host, ip, req.port)
            if target is None or state is None:
                rec.reason = reason
                transport.write(_response("403 Forbidden", reason, "X-Execbox-Egress: denied\r\n"))
                transport.close()
                return
            rec.ip, rec.decision, rec.reason = str(target), "allowed", reason
            greeting = b"HTTP/1.1 200 Connection established\r\n\r\n" if req.method == "CONNECT" else b""
            first = req.head + rest  # sent by splice itself, so counted here
            rec.bytes_up += len(first)
            state.bytes_total += len(first)
            try:
                await splice(state, transport, str(target), req.port, rec, CONNECT_TIMEOUT,
                             first, greeting=greeting)
            except (OSError, TimeoutError) as e:
                rec.reason = f"upstream connect failed: {e}"[:300]
                transport.write(_response("502 Bad Gateway", f"cannot reach {req.host}:{req.port}"))
                transport.close()
        except asyncio.CancelledError:
            transport.abort()
            raise
        finally:
            if state is not None:
                state.active -= 1
            if rec.port is not None:
                rec.duration_ms = round((time.monotonic() - started) * 1000, 3)
                audit.record(rec)
            if not transport.is_closing():
                transport.close()


    def _lookup(self, box: str) -> Grant | None:
        try:
            return self.lookup(box)
        except Exception:  # noqa: BLE001 - a broken lookup refuses; it never opens
            log.exception("egress proxy: looking up %s failed", box)
            return None

    def _state(self, box: str) -> _BoxState:
        state = self._boxes.get(box)
        if state is None:
            if len(self._boxes) >= MAX_TRACKED:
                self._boxes = {k: v for k, v in self._boxes.items() if v.active}
            state = self._boxes[box] = _BoxState(box, self.limits)
        return state


def _ip(host: str) -> ipaddress.IPv4Address | None:
    try:
        return ipaddress.IPv4Address(host)
    except ValueError:
        return None
