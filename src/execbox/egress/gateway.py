"""The egress gateway: a box's only way out. One asyncio thread serves every box.

Per box it owns two sockets that live in the box's network namespace (created there by
boxes/netns.py): a TCP listener every outgoing TCP connection of the box is redirected to
(iptables REDIRECT; the original destination comes from SO_ORIGINAL_DST) and a UDP socket the
box's DNS queries are redirected to. Upstream connections are opened from the service's own
namespace, only after the checks below.

DNS: a name the policy allows is answered with a *synthetic* address from 198.19.0.0/16 that
means "this name" to this box's gateway (AAAA: empty answer; anything else: NXDOMAIN).
Connect: a synthetic address is mapped back to its name, the name is checked against the
policy for the port, and resolved again *now*; the first resolved address that passes the
IP checks is dialled. So a name that rebinds to 127.0.0.1 or a host address after the DNS
answer is refused at connect time (DNS-rebinding safe), and a box can reach a hostname-entry
destination only by that name. A literal destination IP must pass the IP rules on its own.

Every attempt is audited (egress/audit.py); per-box caps bound concurrent connections and the
total bytes moved. The policy of a live box can be replaced (narrowed) at any time; the box's
state, and what a narrowing cuts, is its ``BoxLink`` (egress/link.py).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import struct
import threading
import time
from typing import Any

from . import audit, relay
from .box_dns import BoxDns
from .conntrack import ConntrackAudit
from .link import NARROWED_PENDING, SYNTH_NET, BoxLink, Limits, Pending
from .policy import EgressPolicy
from .relay import splice
from .resolver import ResolverBusy, resolve

__all__ = ["BOX_GONE", "CONNECT_TIMEOUT", "SYNTH_NET", "BoxLink", "Gateway", "Limits", "decide", "gateway"]

log = logging.getLogger("execbox.egress")

SO_ORIGINAL_DST = 80
CONNECT_TIMEOUT = 10.0
BOX_GONE = "the box went before the gateway served this connection"
_HTTP_REQ = re.compile(rb"^[A-Z]{3,8} \S+ HTTP/1\.[01]\r?\n")


class Gateway:
    """Process-wide singleton (``gateway()``); its event loop runs in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="execbox-egress", daemon=True)
        self._thread.start()

    def thread_id(self) -> int | None:
        """The event-loop thread's kernel id (its CPU time is the gateway's; bench_egress reads it)."""
        return self._thread.native_id

    def _run(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def attach(self, box: str, policy: EgressPolicy, tcp: socket.socket, udp: socket.socket,
               limits: Limits | None = None, ct: socket.socket | None = None,
               box_addr: str | None = None, capped: socket.socket | None = None,
               spent: socket.socket | None = None) -> BoxLink:
        """``ct``/``box_addr``: the conntrack event socket and address of a kernel-routed box;
        ``capped``/``spent``: its listeners for connections past the box's connection cap and
        after its byte quota is spent (the box's namespace counts both paths and REDIRECTs those
        there), each refused and audited."""
        link = BoxLink(box, policy, limits or Limits.from_env(), tcp, udp)
        link._capped, link._spent = capped, spent
        if ct is not None and box_addr is not None:
            link.conntrack = ConntrackAudit(link, ct, box_addr)
        self._run(self._attach(link))
        return link

    async def _attach(self, link: BoxLink) -> None:
        link._server = await asyncio.start_server(lambda r, w: self._handle(link, r, w), sock=link._tcp,
                                                  limit=1 << 18)
        link._transport, _ = await self.loop.create_datagram_endpoint(lambda: BoxDns(link), sock=link._udp)
        if link._capped is not None:
            link._capped_server = await asyncio.start_server(lambda r, w: self._handle(link, r, w, over="connections"),
                                                             sock=link._capped)
        if link._spent is not None:
            link._spent_server = await asyncio.start_server(lambda r, w: self._handle(link, r, w, over="bytes"),
                                                            sock=link._spent)
        if link.conntrack is not None:
            self.loop.add_reader(link.conntrack.sock.fileno(), link.conntrack.readable)

    def detach(self, link: BoxLink) -> None:
        try:
            self._run(self._detach(link))
        except Exception:  # noqa: BLE001
            log.exception("egress: detaching %s failed", link.box)

    async def _detach(self, link: BoxLink) -> None:
        self._drain_backlog(link)
        for server in (link._server, link._capped_server, link._spent_server):
            if server is not None:
                server.close()
        if link._transport is not None:
            link._transport.close()
        if link.conntrack is not None:
            self.loop.remove_reader(link.conntrack.sock.fileno())
            link.conntrack.readable()  # what already arrived
        link.connections.closed = True  # what ends from here on is no flood: recorded row by row
        link.summarize_dns_denials(link.dns_denials.drain())
        link.summarize_tcp_refusals(link.tcp_refusals.drain())
        link.connections.summarize(link.connections.drain())
        if link.conntrack is not None:
            link.conntrack.close()
        for r in list(link.relays):
            r.abort()
        for w in list(link._writers):
            w.transport.abort()

    @staticmethod
    def _drain_backlog(link: BoxLink) -> None:
        """Audit the box's connections still queued on the gateway's listeners when it goes.

        The kernel completed their handshakes, so the box saw them connect; closing the listeners
        would reset them with no row. Each gets a denied row (within the box's refusal budget, as
        any refusal) and is closed.
        """
        started = time.monotonic()
        for sock in (link._tcp, link._capped, link._spent):
            while sock is not None and sock.fileno() >= 0:
                try:
                    conn, _ = sock.accept()
                except OSError:  # BlockingIOError: the queue is empty
                    break
                with conn:
                    dst = original_dst(conn)
                    if dst is None:
                        continue
                    name = link.name_of(dst[0]) if dst[0] in SYNTH_NET else None
                    rec = link.record(kind="tcp", host=name, ip=str(dst[0]) if name is None else None, port=dst[1],
                                      decision="denied", reason=BOX_GONE)
                    link.tcp_refusals.submit(rec, link.summarize_tcp_refusals, started)

    # -- connection path --------------------------------------------------------------------
    async def _handle(self, link: BoxLink, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      over: str = "") -> None:
        """``over``: the connection came through a cap listener (``connections`` or ``bytes``) and
        is refused whatever its destination."""
        started = time.monotonic()
        # Nothing is read from the box until the decision: an intercepted TLS connection must reach
        # the TLS layer with its ClientHello still in the socket (start_tls resumes reading).
        writer.transport.pause_reading()
        original = original_dst(writer.get_extra_info("socket"))
        if original is None:
            writer.transport.abort()
            return
        dst, port = original
        name = link.name_of(dst) if dst in SYNTH_NET else None
        rec = link.record(kind="tcp", host=name, ip=str(dst) if name is None else None, port=port)
        link.active += 1
        link._writers.add(writer)
        refused = False
        pending: Pending | None = None
        try:
            if (str(dst), port) == tuple(writer.get_extra_info("sockname") or ())[:2]:
                # not REDIRECTed: the box dialled a listener of the gateway in its namespace itself
                target, reason = None, f"{dst}:{port} is the gateway's own listener, not a destination"
            elif over == "connections":
                target, reason = None, f"too many concurrent connections (cap {link.limits.max_connections})"
            elif over:
                target, reason = None, f"byte cap of {link.limits.max_bytes} reached for this box"
            else:  # a narrowing from here until the relay starts cuts it too (link.Pending)
                pending = Pending(rec, asyncio.current_task(), writer.transport)
                link.pending.add(pending)
                target, reason = await decide(link, name, dst, port)
            if target is None:  # audited before the box can read the refusal
                link.pending.discard(pending)  # type: ignore[arg-type]
                rec.reason, refused = reason, True
                link.tcp_refusals.submit(rec, link.summarize_tcp_refusals, started)
                await _refuse(reader, writer, reason)
                return
            rec.ip = str(target)
            rec.decision, rec.reason = "allowed", reason
            injector = link.intercept
            try:
                if injector is not None and name is not None and link.policy.credentials_for(name, port):
                    rec.injected = True
                    await injector.serve(link, name, str(target), port, reader, writer, rec)
                else:
                    await splice(link, writer.transport, str(target), port, rec, CONNECT_TIMEOUT)
            except relay.Narrowed:  # narrowed while dialling: nothing was relayed
                refused = self._cut_pending(link, rec, started)
                writer.transport.abort()
            except (OSError, TimeoutError) as e:
                rec.reason = f"upstream connect failed: {e}"[:300]
                writer.transport.abort()
        except asyncio.CancelledError:
            if pending is None or not pending.cut:
                raise
            refused = self._cut_pending(link, rec, started)  # Pending.abort reset the box's side
        finally:
            link.pending.discard(pending)  # type: ignore[arg-type]
            link.active -= 1
            link._writers.discard(writer)
            if not refused:
                link.connections.add(rec, started)
            if not writer.is_closing():
                writer.close()

    @staticmethod
    def _cut_pending(link: BoxLink, rec: audit.AuditRecord, started: float) -> bool:
        """A connection a narrowing reached before its relay began: refused, on record as such."""
        rec.decision, rec.reason = "denied", NARROWED_PENDING
        link.tcp_refusals.submit(rec, link.summarize_tcp_refusals, started)
        return True


def original_dst(sock: Any) -> tuple[ipaddress.IPv4Address, int] | None:
    """Where the box addressed a REDIRECTed connection (SO_ORIGINAL_DST), or None."""
    try:
        raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        return ipaddress.IPv4Address(raw[4:8]), struct.unpack_from("!H", raw, 2)[0]
    except (OSError, ValueError):
        return None


async def decide(link: Any, name: str | None, dst: ipaddress.IPv4Address | None,
                 port: int) -> tuple[ipaddress.IPv4Address | None, str]:
    """Where a connection may go: ``(ip to dial, why)`` or ``(None, why not)``.

    ``link`` is anything with ``policy``, ``limits``, ``active`` and ``bytes_total`` (a BoxLink, or
    the egress proxy's per-pod state). ``name``: the destination was asked for by name (a synthetic
    address mapped back, or a proxy request's host); it is checked for the port, resolved *now*
    and every address is checked (rebinding-safe). Otherwise ``dst`` is a literal IP checked alone.
    """
    policy = link.policy
    if link.active > link.limits.max_connections:
        return None, f"too many concurrent connections (cap {link.limits.max_connections})"
    if link.bytes_total >= link.limits.max_bytes:
        return None, f"byte cap of {link.limits.max_bytes} reached for this box"
    if policy.mode == "none":
        return None, "network is none"
    if name is not None:
        if not policy.name_allowed(name, port):
            return None, f"{name}:{port} is not allowed by the network policy"
        try:
            addrs = await resolve(name, link)
        except ResolverBusy as e:
            return None, str(e)
        policy = link.policy  # narrowed while the lookup ran: the connection follows the new one
        if not policy.name_allowed(name, port):
            return None, NARROWED_PENDING
        if not addrs:
            return None, f"{name} does not resolve"
        why = ""
        for ip in addrs:
            ok, why = policy.ip_allowed(ip, port, via_name=True)
            if ok:
                return ip, f"{name} allowed"
        return None, f"{name} resolves to a denied address: {why}"
    if dst is None or dst in SYNTH_NET:
        return None, f"{dst} is not an address this box resolved"
    ok, why = policy.ip_allowed(dst, port)
    return (dst, why) if ok else (None, why)


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reason: str) -> None:
    """Plain HTTP gets a 403 naming the reason; anything else (TLS...) a reset."""
    writer.transport.resume_reading()
    first = b""
    deadline = time.monotonic() + 1.0
    try:  # the whole request head (so the client is done writing before we answer and close)
        while len(first) < 8192 and b"\r\n\r\n" not in first:
            chunk = await asyncio.wait_for(reader.read(2048), max(0.01, deadline - time.monotonic()))
            if not chunk:
                break
            first += chunk
            if not _HTTP_REQ.match(first) and len(first) >= 16:
                break  # not plain HTTP: no need to wait for more
    except (TimeoutError, OSError):
        pass
    if _HTTP_REQ.match(first):
        body = f"execbox egress denied: {reason}\n".encode()
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nX-Execbox-Egress: denied\r\n"
                     b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        try:
            await asyncio.wait_for(writer.drain(), 2.0)
        except (TimeoutError, OSError):
            pass
        writer.close()
        return
    sock = writer.get_extra_info("socket")
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()


_gw: Gateway | None = None
_gw_lock = threading.Lock()


def gateway() -> Gateway:
    global _gw
    with _gw_lock:
        if _gw is None:
            _gw = Gateway()
        return _gw
