"""Audit of kernel-routed connections (boxes/netroute.py) from the box namespace's conntrack events.

The gateway never sees these connections, so their records come from the kernel: a NEW event
opens one (tenant, session and run as they are at that moment), an UPDATE into a closing TCP state
marks its end, and the DESTROY event brings the byte counters. The kernel reaps an ended entry
only when its garbage collector passes by (seconds to a minute later), so on TIME_WAIT or CLOSE
the entry is deleted at once (by its original tuple, in the box's own namespace): its DESTROY
event, and so the record, follow within milliseconds. Bytes here are IP bytes, headers
included, where the gateway counts payload. Connections the namespace REDIRECTs to the gateway
show up too; they are skipped (their reply comes from 127.0.0.1), the gateway audits them itself.
Rows go through the box's budgets like the gateway's (``BoxLink.connections``, ``tcp_refusals``):
a box can open routed connections, or have them refused, thousands of times a second.
Messages are read with a small attribute walker (only the fields above): the reader runs on the
gateway's loop while the box's transfers run, so it must cost microseconds per message.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from . import audit
from .policy import is_host_address

log = logging.getLogger("execbox.egress")

NETLINK_NETFILTER = 12
IPCTNL_MSG_CT_NEW = 0
IPCTNL_MSG_CT_GET = 1
IPCTNL_MSG_CT_DELETE = 2
NFNL_SUBSYS_CTNETLINK = 1
# linux/netfilter/nfnetlink_conntrack.h
CTA_TUPLE_ORIG, CTA_TUPLE_REPLY, CTA_PROTOINFO, CTA_MARK = 1, 2, 4, 8
CTA_COUNTERS_ORIG, CTA_COUNTERS_REPLY, CTA_ID, CTA_ZONE, CTA_MARK_MASK, CTA_FILTER = 9, 10, 12, 18, 21, 25
CTA_FILTER_ORIG_FLAGS, CTA_FILTER_REPLY_FLAGS, CTA_FILTER_F_IP_SRC = 1, 2, 1 << 0
NLA_F_NESTED = 0x8000
CTA_TUPLE_IP, CTA_TUPLE_PROTO = 1, 2
CTA_IP_V4_SRC, CTA_IP_V4_DST = 1, 2
CTA_PROTO_NUM, CTA_PROTO_DST_PORT = 1, 3
CTA_COUNTERS_BYTES = 2
CTA_PROTOINFO_TCP, CTA_PROTOINFO_TCP_STATE = 1, 1
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 1, 4, 0x300
NLM_F_CREATE = 0x400
NLMSG_ERROR, NLMSG_DONE = 2, 3
CLOSING = {4, 5, 6, 7, 8}  # FIN_WAIT, CLOSE_WAIT, LAST_ACK, TIME_WAIT, CLOSE
ENDED = {7, 8}  # TIME_WAIT, CLOSE: nothing more will flow
REASON = "kernel route (IP allow entry)"
LIMITED_MARK = 0x10000  # connmark flag set by the box namespace's byte cap (boxes/netns.py, EXB-OVER)


class ConntrackAudit:
    """Reads one box's conntrack event socket on the gateway's loop and audits its routed connections."""

    def __init__(self, link: Any, sock: socket.socket, box_addr: str) -> None:
        self.link = link
        self.sock = sock
        self.box_addr = box_addr
        self.open: dict[int, tuple[audit.AuditRecord, float, float | None]] = {}

    def readable(self) -> None:
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError as e:  # ENOBUFS: the kernel dropped events; the records are lost, say so
                log.warning("egress: conntrack events of %s lost (%s)", self.link.box, e)
                continue
            if not data:
                return
            off = 0
            while off + 16 <= len(data):
                length = struct.unpack_from("=I", data, off)[0]
                if length < 16:
                    break
                try:
                    if struct.unpack_from("=H", data, off + 4)[0] >> 8 == NFNL_SUBSYS_CTNETLINK:
                        self.event(data[off:off + length])
                except Exception:  # noqa: BLE001 - one odd message must not stop the audit
                    log.exception("egress: cannot decode a conntrack event of %s", self.link.box)
                off += (length + 3) & ~3

    def event(self, raw: bytes) -> None:
        mtype, flags = struct.unpack_from("=HH", raw, 4)
        kind = mtype & 0xFF
        top = _attrs(raw, 20, len(raw))
        orig, reply = _tuple(raw, top.get(CTA_TUPLE_ORIG)), _tuple(raw, top.get(CTA_TUPLE_REPLY))
        if orig is None or reply is None or orig[2] != socket.IPPROTO_TCP:
            return
        src, dst, _, port = orig
        if src != self.box_addr or reply[0] != dst:
            return  # not the box's, or redirected to the gateway
        ct_id = _u(raw, top.get(CTA_ID))
        now = time.monotonic()
        if kind == IPCTNL_MSG_CT_NEW:
            if ct_id in self.open:
                rec, started, closed = self.open[ct_id]
                state = _tcp_state(raw, top.get(CTA_PROTOINFO))
                if closed is None and state in CLOSING:
                    self.open[ct_id] = (rec, started, now)
                if state in ENDED:
                    self._delete(raw, top[CTA_TUPLE_ORIG])
                return
            if not flags & NLM_F_CREATE:
                return  # an update of a connection opened before we listened
            self.open[ct_id] = (self._record(dst, port), now, None)
        elif kind == IPCTNL_MSG_CT_DELETE:
            rec, started, closed = self.open.pop(ct_id, (None, now, None))
            if rec is None:
                rec = self._record(dst, port)
            rec.bytes_up = _counter(raw, top.get(CTA_COUNTERS_ORIG))
            rec.bytes_down = _counter(raw, top.get(CTA_COUNTERS_REPLY))
            if not rec.bytes_down and rec.decision == "allowed":
                rec.reason = f"{REASON}: no answer from upstream"
            self.link.bytes_total += rec.bytes_up + rec.bytes_down
            cap = self.link.limits.max_bytes
            if rec.decision == "allowed" and (self.link.bytes_total > cap  # the host's quota reset it
                                              or _u(raw, top.get(CTA_MARK)) & LIMITED_MARK):  # the box's
                rec.decision, rec.reason = "limited", f"byte cap of {cap} reached ({REASON})"
            rec.duration_ms = round(((closed or now) - started) * 1000, 3)
            if rec.decision == "denied":  # within the box's budgets, as the gateway's rows are
                self.link.tcp_refusals.submit(rec, self.link.summarize_tcp_refusals)
            else:
                self.link.connections.add(rec)

    def _record(self, ip: str, port: int) -> audit.AuditRecord:
        rec = self.link.record(kind="tcp", host=None, ip=ip, port=port)
        if is_host_address(ipaddress.IPv4Address(ip)):  # listed by CIDR, refused by the host's INPUT rule
            rec.reason = f"{ip} is an address of the host (refused by the host's firewall)"
        else:
            rec.decision, rec.reason = "allowed", REASON
        return rec

    def _delete(self, raw: bytes, orig: Span) -> None:
        """Ask the kernel to drop the entry now, naming it by the event's own CTA_TUPLE_ORIG."""
        try:
            # the attribute with its header; no ACK asked: errors arrive as messages the reader skips
            _request(self.sock, IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST, raw[orig[0] - 4:orig[1]])
        except OSError as e:  # the entry then ends with the kernel's own timeout
            log.debug("egress: conntrack delete failed: %s", e)

    def close(self) -> None:
        """Record what is still open (the box is going away; its namespace's entries with it; at
        most its connection cap of them, so no budget)."""
        for rec, started, closed in self.open.values():
            rec.duration_ms = round(((closed or time.monotonic()) - started) * 1000, 3)
            rec.reason = f"{REASON}: box removed before the connection's end was seen"
            audit.record(rec)
        self.open.clear()


Entry = tuple[str, str, int, int, bytes]  # source, destination, protocol, destination port, request attributes


def query_socket() -> socket.socket:
    """A conntrack request socket (no event groups) of the calling thread's network namespace."""
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    try:
        s.bind((0, 0))
        s.settimeout(5.0)
    except OSError:
        s.close()
        raise
    return s


def entries(sock: socket.socket, *, src: str | None = None,
            mark: tuple[int, int] | None = None) -> list[Entry]:
    """The IPv4 conntrack entries of ``sock``'s namespace whose original source is ``src`` and/or
    whose mark is ``mark`` = (value, mask). The kernel filters too where it can (marks always, the source since
    Linux 5.8: older kernels ignore the filter and dump everything); they are filtered here again."""
    attrs = b""
    if mark is not None:
        attrs += _attr(CTA_MARK, struct.pack("!I", mark[0])) + _attr(CTA_MARK_MASK, struct.pack("!I", mark[1]))
    if src is not None:
        attrs += _attr(CTA_TUPLE_ORIG | NLA_F_NESTED, _attr(CTA_TUPLE_IP | NLA_F_NESTED,
                                                            _attr(CTA_IP_V4_SRC, socket.inet_aton(src))))
        attrs += _attr(CTA_FILTER | NLA_F_NESTED, _attr(CTA_FILTER_ORIG_FLAGS, struct.pack("=I", CTA_FILTER_F_IP_SRC))
                       + _attr(CTA_FILTER_REPLY_FLAGS, struct.pack("=I", 0)))
    _request(sock, IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, attrs)
    out: list[Entry] = []
    while True:
        data = sock.recv(1 << 17)
        off = 0
        while off + 16 <= len(data):
            length, mtype = struct.unpack_from("=IH", data, off)
            if length < 16:
                break
            if mtype == NLMSG_DONE:
                return out
            if mtype == NLMSG_ERROR:
                err = -struct.unpack_from("=i", data, off + 16)[0]
                raise OSError(err, f"conntrack dump: {os.strerror(err)}")
            raw = data[off:off + length]
            if mtype >> 8 == NFNL_SUBSYS_CTNETLINK and length > 20:
                top = _attrs(raw, 20, len(raw))
                orig, t = top.get(CTA_TUPLE_ORIG), _tuple(raw, top.get(CTA_TUPLE_ORIG))
                if orig is not None and t is not None and (src is None or t[0] == src) and (
                        mark is None or _u(raw, top.get(CTA_MARK)) & mark[1] == mark[0]):
                    req = raw[orig[0] - 4:orig[1]]  # the attribute with its header names the entry
                    req += b"\0" * (-len(req) % 4)  # before another attribute follows it
                    zone = top.get(CTA_ZONE)
                    if zone is not None:  # an entry of another zone is named with its zone
                        req += _attr(CTA_ZONE, raw[zone[0]:zone[1]])
                    out.append((*t, req))
            off += (length + 3) & ~3


def delete(sock: socket.socket, victims: list[Entry]) -> int:
    """Delete ``victims`` (from ``entries``) on ``sock``, one acknowledged request each; an entry
    already gone is fine, any other refusal raises. Returns how many were deleted."""
    n = 0
    for *_, req in victims:
        _request(sock, IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, req)
        while True:
            data = sock.recv(1 << 16)
            if len(data) >= 20 and struct.unpack_from("=H", data, 4)[0] == NLMSG_ERROR:
                break  # other messages (none are expected on this socket) are skipped
        err = -struct.unpack_from("=i", data, 16)[0]
        if err == 0:
            n += 1
        elif err != errno.ENOENT:
            raise OSError(err, f"conntrack delete: {os.strerror(err)}")
    return n


def cut(sock: socket.socket, keep: Callable[[str, int], bool], *, src: str | None = None,
        mark: tuple[int, int] | None = None) -> int:
    """Delete the entries selected as in ``entries`` except TCP ones to a destination ``keep`` accepts."""
    return delete(sock, [e for e in entries(sock, src=src, mark=mark)
                         if not (e[2] == socket.IPPROTO_TCP and keep(e[1], e[3]))])


def _attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _request(sock: socket.socket, kind: int, flags: int, attrs: bytes) -> None:
    """Send one conntrack request (IPv4) with ``attrs``."""
    attrs += b"\0" * (-len(attrs) % 4)
    head = struct.pack("=IHHII", 20 + len(attrs), (NFNL_SUBSYS_CTNETLINK << 8) | kind, flags, 0, 0)
    sock.send(head + struct.pack("=BBH", socket.AF_INET, 0, 0) + attrs)


Span = tuple[int, int]


def _attrs(raw: bytes, off: int, end: int) -> dict[int, Span]:
    """Netlink attributes between ``off`` and ``end``: type -> (payload start, payload end)."""
    out: dict[int, Span] = {}
    while off + 4 <= end:
        alen, atype = struct.unpack_from("=HH", raw, off)
        if alen < 4 or off + alen > end:
            break
        out[atype & 0x3FFF] = (off + 4, off + alen)
        off += (alen + 3) & ~3
    return out


def _u(raw: bytes, span: Span | None) -> int:
    """A big-endian unsigned integer attribute (ids, ports, counters are in network order)."""
    return int.from_bytes(raw[span[0]:span[1]], "big") if span is not None else 0


def _tuple(raw: bytes, span: Span | None) -> tuple[str, str, int, int] | None:
    """(source IP, destination IP, protocol, destination port) of a CTA_TUPLE_* attribute."""
    if span is None:
        return None
    t = _attrs(raw, *span)
    ip, proto = t.get(CTA_TUPLE_IP), t.get(CTA_TUPLE_PROTO)
    if ip is None or proto is None:
        return None
    a, p = _attrs(raw, *ip), _attrs(raw, *proto)
    src, dst = a.get(CTA_IP_V4_SRC), a.get(CTA_IP_V4_DST)
    if src is None or dst is None:
        return None
    return (socket.inet_ntoa(raw[src[0]:src[1]]), socket.inet_ntoa(raw[dst[0]:dst[1]]),
            _u(raw, p.get(CTA_PROTO_NUM)), _u(raw, p.get(CTA_PROTO_DST_PORT)))


def _counter(raw: bytes, span: Span | None) -> int:
    return _u(raw, _attrs(raw, *span).get(CTA_COUNTERS_BYTES)) if span is not None else 0


def _tcp_state(raw: bytes, span: Span | None) -> int | None:
    tcp = _attrs(raw, *span).get(CTA_PROTOINFO_TCP) if span is not None else None
    state = _attrs(raw, *tcp).get(CTA_PROTOINFO_TCP_STATE) if tcp is not None else None
    return _u(raw, state) if state is not None else None
