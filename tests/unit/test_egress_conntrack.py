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
    monkeypatch.setattr(conntrack.audit, "record", got.append)
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
