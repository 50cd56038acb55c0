"""A connection decided under a policy that was narrowed while it waited (a lookup, an upstream
connect) is refused, not relayed: ``gateway.decide`` reads the policy again after its lookup and
``relay.splice`` after its connect (the egress proxy has no immediate cut, only these checks and
its sweep). The jail gateway's cut of such connections is tests/integration/egress/test_narrowing_in_flight.py."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from execbox.egress import gateway as gw
from execbox.egress import relay
from execbox.egress.audit import AuditRecord
from execbox.egress.link import NARROWED_PENDING
from execbox.egress.policy import parse_policy

WIDE = parse_policy("allowlist", ["api.example.com:443", "www.example.com:443", "203.0.113.0/24:80"])
NARROW = parse_policy("allowlist", ["api.example.com:443"])


def _run(main) -> object:
    """asyncio.run in a thread of its own (an earlier test may leave a loop running in this one)."""
    with ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, main()).result(30)


def _link(policy) -> SimpleNamespace:
    return SimpleNamespace(policy=policy, limits=gw.Limits(), active=1, bytes_total=0, relays=set())


def test_a_lookup_during_which_the_policy_was_narrowed_decides_under_the_narrowed_one(monkeypatch):
    link = _link(WIDE)

    async def lookup(name, box=None):  # noqa: ANN001, ANN202 - the host narrows while the lookup runs
        box.policy = NARROW
        return [ipaddress.IPv4Address("93.184.216.34")]

    monkeypatch.setattr(gw, "resolve", lookup)
    assert _run(lambda: gw.decide(link, "www.example.com", None, 443)) == (None, NARROWED_PENDING)
    link.policy = WIDE  # still allowed after the narrowing: decided as before
    assert _run(lambda: gw.decide(link, "api.example.com", None, 443)) == (
        ipaddress.IPv4Address("93.184.216.34"), "api.example.com allowed")


@pytest.mark.parametrize("host", ["www.example.com", None])
def test_splice_relays_nothing_when_the_policy_was_narrowed_during_its_connect(host):
    """The relay joins ``link.relays`` (where a narrowing finds it) only after the connect: one
    narrowed meanwhile must not be relayed. The policy here is narrowed before the connect ends."""
    link = _link(NARROW)  # decided under WIDE; narrowed since
    got: dict[str, object] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        upstream = socket.create_server(("127.0.0.1", 0))
        upstream.setblocking(False)
        box_side: asyncio.Future = loop.create_future()

        async def on_box(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.transport.pause_reading()
            rec = AuditRecord("b", "tcp", host, "203.0.113.7", 80 if host is None else 443, decision="allowed")
            try:
                await relay.splice(link, writer.transport, "127.0.0.1", upstream.getsockname()[1], rec, 5.0,
                                   b"GET / HTTP/1.1\r\n\r\n")
            except relay.Narrowed:
                got["narrowed"] = True
            box_side.set_result(None)
            writer.close()

        srv = await asyncio.start_server(on_box, "127.0.0.1", 0)
        box = socket.create_connection(srv.sockets[0].getsockname()[:2])
        conn, _ = await asyncio.wait_for(loop.sock_accept(upstream), 5)
        got["upstream"] = await asyncio.wait_for(loop.sock_recv(conn, 100), 5)  # b"": closed, nothing sent
        got["relays"] = len(link.relays)
        for s in (conn, box, upstream):  # (a relay that ran ends with them)
            s.close()
        await asyncio.wait_for(box_side, 5)
        srv.close()

    _run(main)
    assert got == {"narrowed": True, "upstream": b"", "relays": 0}
