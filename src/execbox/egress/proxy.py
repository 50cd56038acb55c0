"""The egress gateway's explicit forward proxy, for boxes that cannot be given redirect rules.

Kubernetes pods run with every capability dropped and on other nodes than the gateway, so the
iptables REDIRECT + synthetic DNS path of gateway.py is not available to them. Instead each pod's
environment names this proxy (``HTTP(S)_PROXY``) and proxy-aware clients send it:

* ``CONNECT host:port`` (HTTPS, or any TCP): ``200 Connection established``, then bytes are relayed;
* absolute-form plain HTTP (``GET http://host[:port]/path HTTP/1.1``): rewritten to origin form,
  ``Proxy-*``/``Connection``/``Keep-Alive`` dropped and ``Connection: close`` forced, so one proxied
  connection carries one request to one destination.

Parsing is in proxy_http.py. The box authenticates with ``Proxy-Authorization: Basic
base64(<box>:<token>)``; a backend's ``egress_token(box)`` says what the token must be (compared
in constant time). Missing or bad credentials: 407. Then that backend's ``egress_lookup(box)``
(blocking; run in a thread) gives the box's current policy, ids and addresses: credentials used
from another client address than the box's own are refused too (407; the token is readable by
the box's code, so it must not work for a neighbour that reads it), and the destination goes
through the gateway's own decision (``gateway.decide``: names resolved here and now, every
address checked, always-denied ranges, per-box caps), is relayed by ``relay.splice`` and audited
once per attempt. Denied: ``403`` with ``X-Execbox-Egress: denied`` and the reason. Open tunnels
are re-checked every ``SWEEP`` s against the pod's current policy (``_sweep``): narrowed away or
pod gone, they are cut.
Credential injection is not offered here (the kubernetes provider refuses ``network_credentials``).

One proxy per listen address and process (``share``/``unshare``): a provider rebuilt on a config
change starts while the one it replaces still serves its sessions, and both are its backends.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from . import audit
from .gateway import CONNECT_TIMEOUT, Limits, decide, gateway
from .link import NARROWED_PENDING
from .policy import EgressPolicy
from .proxy_http import BadRequest, client_address, ipv4_literal, parse_request, peer_of, response
from .relay import Narrowed, cut_unlisted, splice

log = logging.getLogger("execbox.egress.proxy")

MAX_HEAD = 16384
HEAD_TIMEOUT = 3.0  # a connection that has not sent its request head by then is closed
MAX_CONNECTIONS = 4096  # open proxy connections, all boxes together (each box also has its own cap)
PEER_SHARE = 2  # one client address holds at most this many times a box's connection cap, before
# its credentials are even read: one pod opening idle connections cannot take the whole proxy
MAX_TRACKED = 10000  # per-box counters kept; idle ones are dropped past it
SWEEP = 1.0  # seconds between re-checks of the open tunnels against their pods' current policies


@dataclass
class Grant:
    """What ``egress_lookup`` says about a box: its current policy, the ids its audit records carry
    and the addresses it connects from.

    ``addresses``: the box's own IPs (a pod's ``status.podIPs``); a request carrying its credentials
    from any other client address is refused. None: the backend cannot know them, not checked. The
    proxy must then see the boxes' own addresses, not a NAT's (docs/kubernetes.md)."""

    policy: EgressPolicy
    tenant_id: str | None = None
    session_id: str | None = None
    instance_id: str | None = None
    addresses: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.addresses, str):
            self.addresses = (self.addresses,)
        elif self.addresses is not None:
            self.addresses = tuple(self.addresses)

    def admits(self, peer: str) -> bool:
        """Whether a request from client address ``peer`` may use this box's credentials."""
        if self.addresses is None:
            return True
        ip = client_address(peer)
        return ip is not None and any(client_address(a) == ip for a in self.addresses)


@dataclass
class _BoxState:
    """Per-box counters on this proxy (the caps of gateway.Limits, per gateway replica)."""

    box: str
    limits: Limits
    policy: EgressPolicy = field(default_factory=EgressPolicy)
    active: int = 0
    bytes_total: int = 0
    lookup_slots: asyncio.Semaphore | None = None  # its share of the resolver (resolver.py)
    relays: set = field(default_factory=set)  # its open tunnels (relay.py), re-checked by the sweep
    tenant_id: str | None = None  # as its last grant said (the resolver's per-tenant share)
    session_id: str | None = None
    connections: audit.ConnectionRows = field(init=False)  # rows of its tunnels and requests, budgeted

    def __post_init__(self) -> None:
        self.connections = audit.ConnectionRows(lambda **kw: audit.AuditRecord(
            box=self.box[:253], tenant_id=self.tenant_id, session_id=self.session_id, **kw))


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


class Backend(Protocol):
    """Who knows the boxes (the kubernetes provider): their tokens and current policies."""

    def egress_token(self, box: str) -> str: ...

    def egress_lookup(self, box: str) -> Grant | None: ...


class EgressProxy:
    """One listening proxy on the gateway's event loop; ``start``/``stop`` from any thread."""

    def __init__(self, listen: tuple[str, int], backends: list[Backend] | None = None,
                 limits: Limits | None = None) -> None:
        self.listen = listen
        self.backends: list[Backend] = list(backends or [])
        self.limits = limits or Limits.from_env()
        self._boxes: dict[str, _BoxState] = {}
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._peers: Counter[str] = Counter()  # open connections per client address
        self._refusals: dict[str, audit.RowBudget] = {}  # refusal rows per client address
        self._sweeper: asyncio.Task | None = None
        self.address: tuple[str, int] | None = None

    def start(self) -> tuple[str, int]:
        gw = gateway()
        self.address = asyncio.run_coroutine_threadsafe(self._start(), gw.loop).result(10)
        return self.address

    async def _start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Conn(self), self.listen[0], self.listen[1],
                                                reuse_address=True)
        self._sweeper = loop.create_task(self._sweep())
        return self._server.sockets[0].getsockname()[:2]

    async def _sweep(self) -> None:
        """Open tunnels follow their pod: one its narrowed policy no longer allows is cut, and all
        of a pod that is gone (its lookup, cached by the backend for ``EGRESS_TTL``, says so). A
        narrowing made on any replica reaches this one's tunnels within that TTL plus ``SWEEP``."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP)
            for box, state in list(self._boxes.items()):
                if not state.relays and not state.active:  # active: deciding or dialling, its policy
                    continue  # is read again after each wait (gateway.decide, relay.splice)
                try:
                    grant = await loop.run_in_executor(None, self._lookup, list(self.backends), box)
                except Exception:  # noqa: BLE001 - a failed sweep leaves the tunnels to the next one
                    log.exception("egress proxy: re-checking %s failed", box)
                    continue
                if grant is None:
                    cut_unlisted(state.relays, EgressPolicy(), "cut: the box is gone")
                else:
                    state.policy = grant.policy
                    cut_unlisted(state.relays, grant.policy)

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
        if self._sweeper is not None:
            self._sweeper.cancel()
        for t in list(self._tasks):
            t.cancel()

    def _spawn(self, conn: _Conn) -> None:
        assert conn.transport is not None
        peer = peer_of(conn.transport)
        if len(self._tasks) >= MAX_CONNECTIONS or self._peers[peer] >= PEER_SHARE * self.limits.max_connections:
            audit.count_only("tcp", "limited")  # no row: a client past its share could write them endlessly
            conn.transport.abort()
            return
        self._peers[peer] += 1
        task = asyncio.get_running_loop().create_task(self._serve(conn, peer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _t: self._left(peer))

    def _left(self, peer: str) -> None:
        self._peers[peer] -= 1
        if self._peers[peer] <= 0:
            del self._peers[peer]

    def _refused(self, peer: str, rec: audit.AuditRecord, started: float) -> None:
        """Audit a refusal, at most 20 rows a second per client address (the rest summed up)."""
        if len(self._refusals) > MAX_TRACKED:
            self._refusals.clear()
        self._refusals.setdefault(peer, audit.RowBudget()).submit(rec, lambda n: audit.record(audit.AuditRecord(
            box="?", kind="tcp", host=None, ip=None, port=None, reason=(
                f"{n} more refused proxy requests from {peer} within one second (over 20 a second: "
                "counted, not recorded one by one)")), counted=False), started)

    async def _serve(self, conn: _Conn, peer: str = "?") -> None:
        transport = conn.transport
        assert transport is not None
        started = time.monotonic()
        rec = audit.AuditRecord(box="?", kind="tcp", host=None, ip=None, port=None)
        state: _BoxState | None = None
        refused = False  # a refusal is audited before the box can read it
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
                self._refused(peer, rec, started)
                transport.write(response("400 Bad Request", str(e)))
                transport.close()
                return
            ip = ipv4_literal(req.host)
            rec.host, rec.ip, rec.port = (None if ip else req.host), (req.host if ip else None), req.port
            box = req.credentials[0] if req.credentials else None
            backends = self._authenticate(box, req.credentials[1]) if req.credentials and box else []
            if not backends or box is None:
                # not filed under the name it claims: that would put rows on another pod's record
                claimed = re.sub(r"[^A-Za-z0-9._-]", "?", box or "")[:64]
                rec.reason, refused = f"missing or bad proxy credentials (claimed box {claimed!r})", True
                self._refused(peer, rec, started)
                transport.write(response("407 Proxy Authentication Required", rec.reason,
                                          'Proxy-Authenticate: Basic realm="execbox-egress"\r\n'))
                transport.close()
                return
            grant = await asyncio.get_running_loop().run_in_executor(None, self._lookup, backends, box)
            if grant is not None and not grant.admits(peer):
                # another box holding this one's token (its env is readable by its code): not filed
                # under the name it claims either
                claimed = re.sub(r"[^A-Za-z0-9._-]", "?", box)[:64]
                rec.reason, refused = (f"proxy credentials of box {claimed!r} used from {peer}, not from that "
                                       "box's own address"), True
                self._refused(peer, rec, started)
                transport.write(response("407 Proxy Authentication Required", rec.reason,
                                          'Proxy-Authenticate: Basic realm="execbox-egress"\r\n'))
                transport.close()
                return
            if grant is None:  # gone, or not ours: forget its counters
                if box in self._boxes and not self._boxes[box].active:
                    del self._boxes[box]
                target, reason = None, "not a live box of this gateway"
            else:
                state = self._state(box)
                state.policy = grant.policy
                rec.tenant_id, rec.session_id = grant.tenant_id, grant.session_id
                state.tenant_id, state.session_id = grant.tenant_id, grant.session_id
                state.active += 1
                target, reason = await decide(state, None if ip else req.host, ip, req.port)
            rec.box = box[:253]
            if target is None or state is None:
                rec.reason, refused = reason, True
                self._refused(peer, rec, started)
                transport.write(response("403 Forbidden", reason, "X-Execbox-Egress: denied\r\n"))
                transport.close()
                return
            rec.ip, rec.decision, rec.reason = str(target), "allowed", reason
            greeting = b"HTTP/1.1 200 Connection established\r\n\r\n" if req.method == "CONNECT" else b""
            try:
                await splice(state, transport, str(target), req.port, rec, CONNECT_TIMEOUT,
                             req.head + rest, greeting=greeting)
            except Narrowed:  # the pod's policy, read again by the sweep, no longer allows it
                rec.decision, rec.reason, refused = "denied", NARROWED_PENDING, True
                self._refused(peer, rec, started)
                transport.abort()
            except (OSError, TimeoutError) as e:
                rec.reason = f"upstream connect failed: {e}"[:300]
                transport.write(response("502 Bad Gateway", f"cannot reach {req.host}:{req.port}"))
                transport.close()
        except asyncio.CancelledError:
            transport.abort()
            raise
        finally:
            if state is not None:
                state.active -= 1
            if rec.port is not None and not refused:
                if state is not None:
                    state.connections.add(rec, started)
                else:
                    audit.finish(rec, started)
            if not transport.is_closing():
                transport.close()


    def _authenticate(self, box: str, token: str) -> list[Backend]:
        """The backends whose token for ``box`` this is (each compared in constant time)."""
        return [b for b in list(self.backends) if hmac.compare_digest(token.encode(), b.egress_token(box).encode())]

    def _lookup(self, backends: list[Backend], box: str) -> Grant | None:
        """The first of them that knows the box (a rebuilt provider may watch other templates)."""
        for backend in backends:
            try:
                grant = backend.egress_lookup(box)
            except Exception:  # noqa: BLE001 - a broken lookup refuses; it never opens
                log.exception("egress proxy: looking up %s failed", box)
                continue
            if grant is not None:
                return grant
        return None

    def _state(self, box: str) -> _BoxState:
        state = self._boxes.get(box)
        if state is None:
            if len(self._boxes) >= MAX_TRACKED:
                self._boxes = {k: v for k, v in self._boxes.items() if v.active}
            state = self._boxes[box] = _BoxState(box, self.limits)
        return state


_shared: dict[tuple[str, int], EgressProxy] = {}
_shared_lock = threading.Lock()


def share(listen: tuple[str, int], backend: Backend) -> EgressProxy:
    """The process's proxy on ``listen`` (started on first use) with ``backend`` added to it."""
    with _shared_lock:
        proxy = _shared.get(listen)
        if proxy is None:
            proxy = EgressProxy(listen)
            proxy.start()  # OSError (address in use, not local) goes to the caller
            _shared[listen] = proxy
        proxy.backends.append(backend)
        return proxy


def unshare(proxy: EgressProxy, backend: Backend) -> None:
    """Remove ``backend``; the proxy stops with its last backend."""
    with _shared_lock:
        if backend in proxy.backends:
            proxy.backends.remove(backend)
        if not proxy.backends:
            if _shared.get(proxy.listen) is proxy:
                del _shared[proxy.listen]
            proxy.stop()
