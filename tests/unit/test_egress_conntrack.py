"""The kernel route's audit reader (egress/conntrack.py) on conntrack event messages built here
byte by byte, as the kernel lays them out (nlmsghdr, nfgenmsg, nested big-endian attributes)."""

from __future__ import annotations

import socket
import struct

import pytest

from execbox.egress import audit, conntrack
from execbox.egress.gateway import Limits

BOX = "198.18.3.5"
SERVER = "203.0.113.9"


def attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def nested(kind: int, *parts: bytes) -> bytes:
    return attr(kind | 0x8000, b"".join(parts))


def tup(kind: int, src: str, dst: str, dport: int) -> bytes:
    return nested(kind,
                  nested(1, attr(1, socket.inet_aton(src)), attr(2, socket.inet_aton(dst))),
                  nested(2, attr(1, bytes([6])), attr(2, struct.pack("!H", 40000)), attr(3, struct.pack("!H", dport))))


def msg(kind: int, flags: int, ct_id: int, *, dst: str = SERVER, reply_src: str | None = None,
        state: int | None = None, up: int = 0, down: int = 0) -> bytes:
    body = tup(1, BOX, dst, 80) + tup(2, reply_src or dst, BOX, 40000) + attr(12, struct.pack("!I", ct_id))
    if state is not None:
        body += nested(4, nested(1, attr(1, bytes([state]))))
    if kind == conntrack.IPCTNL_MSG_CT_DELETE:
        body += nested(9, attr(1, struct.pack("!Q", 3)), attr(2, struct.pack("!Q", up)))
        body += nested(10, attr(1, struct.pack("!Q", 9)), attr(2, struct.pack("!Q", down)))
    head = struct.pack("=IHHII", 20 + len(body), (1 << 8) | kind, flags, 0, 0)
    return head + struct.pack("=BBH", socket.AF_INET, 0, 0) + body


class Link:
    box = "jail-test"

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.limits = Limits(64, max_bytes)
        self.bytes_total = 0
        self.connections = audit.ConnectionRows(self.record)
        self.tcp_refusals = audit.RowBudget()

    def summarize_tcp_refusals(self, n: int) -> None:
        raise AssertionError(f"{n} refusals summed up")

    def record(self, **kw):  # noqa: ANN003, ANN201
        return audit.AuditRecord(box=self.box, tenant_id="t", session_id="s-ct", run_id="r1", **kw)


class Sock:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.sent: list[bytes] = []

    def recv(self, n: int) -> bytes:
        if not self.chunks:
            raise BlockingIOError
        return self.chunks.pop(0)

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        return len(data)


@pytest.fixture
def records(monkeypatch):
    got: list[audit.AuditRecord] = []
    monkeypatch.setattr(conntrack.audit, "record", lambda rec, counted=True: got.append(rec))
    monkeypatch.setattr(conntrack, "is_host_address", lambda ip: str(ip) == "203.0.113.1")
    return got


def test_a_routed_connection_becomes_one_record_with_its_counters(records):
    link = Link()
    new = msg(0, conntrack.NLM_F_CREATE | 0x200, 7, state=1)
    # two messages in one datagram, as the kernel batches them
    sock = Sock([new + msg(0, 0, 7, state=3),
                 msg(0, 0, 7, state=7),
                 msg(conntrack.IPCTNL_MSG_CT_DELETE, 0, 7, state=7, up=1500, down=2_000_000)])
    reader = conntrack.ConntrackAudit(link, sock, BOX)  # type: ignore[arg-type]
    reader.readable()
    assert len(records) == 1
    rec = records[0]
    assert (rec.ip, rec.port, rec.decision, rec.reason) == (SERVER, 80, "allowed", conntrack.REASON)
    assert (rec.bytes_up, rec.bytes_down, rec.run_id, rec.session_id) == (1500, 2_000_000, "r1", "s-ct")
    assert link.bytes_total == 2_001_500
    # TIME_WAIT: the entry was deleted at once, by its own original tuple
    assert len(sock.sent) == 1
    sent = sock.sent[0]
    assert struct.unpack_from("=H", sent, 4)[0] == (1 << 8) | conntrack.IPCTNL_MSG_CT_DELETE
    assert tup(1, BOX, SERVER, 80) in sent


def test_redirected_and_foreign_connections_are_left_to_the_gateway(records):
    sock = Sock([msg(0, conntrack.NLM_F_CREATE, 1, reply_src="127.0.0.1"),  # REDIRECTed: the gateway's
                 msg(conntrack.IPCTNL_MSG_CT_DELETE, 0, 1, reply_src="127.0.0.1", up=5, down=5),
                 struct.pack("=IHHii", 36, 2, 0, 0, 0) + b"\0" * 20])  # an NLMSG_ERROR reply: skipped
    conntrack.ConntrackAudit(Link(), sock, BOX).readable()  # type: ignore[arg-type]
    assert records == []


def test_host_address_is_denied_and_the_byte_cap_says_limited(records):
    link = Link(max_bytes=1000)
    sock = Sock([msg(0, conntrack.NLM_F_CREATE, 2, dst="203.0.113.1"),
                 msg(conntrack.IPCTNL_MSG_CT_DELETE, 0, 2, dst="203.0.113.1", up=60, down=40),
                 msg(0, conntrack.NLM_F_CREATE, 3),
                 msg(conntrack.IPCTNL_MSG_CT_DELETE, 0, 3, up=200, down=5000)])
    conntrack.ConntrackAudit(link, sock, BOX).readable()  # type: ignore[arg-type]
    host, capped = records
    assert host.decision == "denied" and "address of the host" in host.reason
    assert capped.decision == "limited" and "byte cap of 1000" in capped.reason


def test_connections_still_open_at_removal_are_recorded(records):
    reader = conntrack.ConntrackAudit(Link(), Sock([msg(0, conntrack.NLM_F_CREATE, 4)]), BOX)  # type: ignore[arg-type]
    reader.readable()
    assert records == []
    reader.close()
    assert len(records) == 1 and "box removed" in records[0].reason


def test_a_connection_the_box_namespace_cut_at_its_byte_cap_says_limited(records):
    """The box namespace's quota (both paths together) marks what it cuts; the link's own count
    (gateway payload + routed IP bytes) may still be under the cap."""
    link = Link(max_bytes=1_000_000)
    gone = msg(conntrack.IPCTNL_MSG_CT_DELETE, 0, 5, up=200, down=5000)
    gone += attr(conntrack.CTA_MARK, struct.pack("!I", 0x5EB | conntrack.LIMITED_MARK))
    gone = struct.pack("=I", len(gone)) + gone[4:]
    conntrack.ConntrackAudit(link, Sock([msg(0, conntrack.NLM_F_CREATE, 5), gone]), BOX).readable()  # type: ignore[arg-type]
    assert records[0].decision == "limited" and "byte cap of 1000000" in records[0].reason


def entry(src: str, dst: str, dport: int, mark: int = 0, zone: int | None = None) -> bytes:
    """One message of a conntrack dump (IPCTNL_MSG_CT_NEW, NLM_F_MULTI)."""
    body = tup(1, src, dst, dport) + tup(2, dst, src, 40000) + attr(conntrack.CTA_MARK, struct.pack("!I", mark))
    if zone is not None:
        body += attr(conntrack.CTA_ZONE, struct.pack("!H", zone))
    head = struct.pack("=IHHII", 20 + len(body), 1 << 8, 2, 1, 0)
    return head + struct.pack("=BBH", socket.AF_INET, 0, 0) + body


def nlmsg(kind: int, payload: bytes = b"") -> bytes:
    return struct.pack("=IHHII", 16 + len(payload), kind, 0, 1, 0) + payload


def ack(err: int) -> bytes:
    return nlmsg(conntrack.NLMSG_ERROR, struct.pack("=i", -err) + b"\0" * 16)


def test_cut_deletes_only_entries_no_longer_routed_and_names_them_exactly():
    other = "198.18.9.9"
    dump = [entry(BOX, SERVER, 80) + entry(BOX, SERVER, 8080, zone=3) + entry(other, SERVER, 8080),
            entry(BOX, "203.0.113.77", 443) + nlmsg(conntrack.NLMSG_DONE, b"\0" * 4)]
    sock = Sock([*dump, ack(0), ack(2)])  # the second one was already gone (ENOENT): fine
    n = conntrack.cut(sock, lambda dst, port: (dst, port) == (SERVER, 80), src=BOX)  # type: ignore[arg-type]
    assert n == 1
    request, *deletes = sock.sent
    # a dump, filtered by the kernel on the original source where it can (CTA_FILTER)
    assert struct.unpack_from("=HH", request, 4) == ((1 << 8) | conntrack.IPCTNL_MSG_CT_GET,
                                                     conntrack.NLM_F_REQUEST | conntrack.NLM_F_DUMP)
    assert socket.inet_aton(BOX) in request and struct.pack("=HH", 20, conntrack.CTA_FILTER | 0x8000) in request
    # still routed: kept; another box's entry: untouched (filtered here again); the rest: deleted
    assert len(deletes) == 2
    assert tup(1, BOX, SERVER, 8080) in deletes[0] and attr(conntrack.CTA_ZONE, struct.pack("!H", 3)) in deletes[0]
    assert tup(1, BOX, "203.0.113.77", 443) in deletes[1]
    assert all(struct.unpack_from("=HH", d, 4) == ((1 << 8) | conntrack.IPCTNL_MSG_CT_DELETE,
                                                   conntrack.NLM_F_REQUEST | conntrack.NLM_F_ACK) for d in deletes)


def test_cut_by_mark_and_a_refused_delete_raises():
    dump = [entry(BOX, SERVER, 8080, mark=0x5EB | conntrack.LIMITED_MARK) + entry(BOX, SERVER, 9000, mark=7)
            + nlmsg(conntrack.NLMSG_DONE, b"\0" * 4), ack(1)]  # EPERM
    sock = Sock(dump)
    with pytest.raises(OSError, match="conntrack delete"):
        conntrack.cut(sock, lambda dst, port: False, mark=(0x5EB, 0xFFFF))  # type: ignore[arg-type]
    assert len(sock.sent) == 2 and tup(1, BOX, SERVER, 8080) in sock.sent[1]
    with pytest.raises(OSError, match="conntrack dump"):
        conntrack.entries(Sock([ack(1)]), mark=(0x5EB, 0xFFFF))  # type: ignore[arg-type]


def test_a_flood_of_routed_connections_gets_bounded_rows_and_exact_bytes(records):
    """A routed box can open (or have reset) connections to a listed address thousands of times a
    second: rows past the box's budget are summed up in one row that carries their bytes."""
    link = Link()
    link.connections.clock = lambda: 100.0  # one second, however slow this machine is
    n = 120
    events = [m for i in range(n) for m in (msg(0, conntrack.NLM_F_CREATE, 100 + i),
                                            msg(conntrack.IPCTNL_MSG_CT_DELETE, 0, 100 + i, up=60, down=40 + i))]
    conntrack.ConntrackAudit(link, Sock(events), BOX).readable()  # type: ignore[arg-type]
    per = link.connections.per_second
    assert len(records) == per and all(r.reason.startswith(conntrack.REASON) for r in records)
    link.connections.summarize(link.connections.drain())  # the box goes (Gateway._detach)
    summary = records[-1]
    assert summary.reason.startswith(f"{n - per} more connections allowed within one second")
    assert (summary.bytes_up, summary.bytes_down) == (60 * (n - per), sum(40 + i for i in range(per, n)))
    assert summary.decision == "allowed" and summary.session_id == "s-ct" and summary.host is None
