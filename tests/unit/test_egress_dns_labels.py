"""The gateway's resolver answers only names made of plain labels: a dot or backslash inside one
label would otherwise read as a sub-domain of an allowed wildcard (dnslib prints labels as they are)."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest
from dnslib import QTYPE, RCODE, DNSLabel, DNSRecord

from execbox.egress import box_dns
from execbox.egress import gateway as gw
from execbox.egress.policy import parse_policy


class _Link:
    policy = parse_policy("allowlist", ["*.api.corp"])

    def __init__(self) -> None:
        self.dns_denials = gw.audit.RowBudget()

    def summarize_dns_denials(self, n: int) -> None:
        gw.BoxLink.summarize_dns_denials(self, n)  # type: ignore[arg-type]

    def synth(self, name: str) -> ipaddress.IPv4Address:
        return ipaddress.IPv4Address("198.19.0.7")

    def record(self, **kw):  # noqa: ANN003, ANN201
        return kw


class _Transport:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def sendto(self, data: bytes, addr) -> None:  # noqa: ANN001
        self.sent.append(data)


@pytest.fixture
def ask(monkeypatch):
    audited: list[dict] = []
    monkeypatch.setattr(gw.audit, "record", lambda rec, counted=True: audited.append(rec))

    async def resolve(name: str, box: object = None) -> list[str]:
        return ["203.0.113.5"]

    monkeypatch.setattr(box_dns, "resolve", resolve)

    def go(labels: list[bytes]) -> tuple[DNSRecord, list[dict]]:
        dns = box_dns.BoxDns(_Link())
        dns.transport = _Transport()  # type: ignore[assignment]
        q = DNSRecord.question("placeholder.corp")
        q.q.qname = DNSLabel(labels)
        asyncio.run(dns._answer(q.pack(), ("10.0.0.2", 5353)))
        return DNSRecord.parse(dns.transport.sent[0]), audited  # type: ignore[union-attr]
    return go


def test_a_plain_sub_domain_of_the_wildcard_is_answered(ask):
    reply, audited = ask([b"evil", b"api", b"corp"])
    assert reply.header.rcode == RCODE.NOERROR and str(reply.rr[0].rdata) == "198.19.0.7"
    assert reply.rr[0].rtype == QTYPE.A and not audited


@pytest.mark.parametrize("labels", [[b"evil.api", b"corp"], [b"x\\", b"api", b"corp"], [b"evil api", b"api", b"corp"]])
def test_labels_with_dots_backslashes_or_spaces_are_refused(ask, labels):
    reply, audited = ask(labels)
    assert reply.header.rcode == RCODE.NXDOMAIN and not reply.rr
    assert audited and audited[0]["decision"] == "denied"
