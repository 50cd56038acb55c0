"""The box's resolver: the gateway's UDP socket its DNS queries are redirected to.

A name the policy allows is answered with a synthetic address (``BoxLink.synth``) that means
"this name" to the box's gateway; AAAA and other types get an empty answer (no IPv6 path exists);
anything else is NXDOMAIN, audited within the box's refusal budget. Split from gateway.py, which
keeps the connection path.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from .resolver import ResolverBusy, resolve

_DNS_LABEL = re.compile(rb"[A-Za-z0-9_-]{1,63}")


class BoxDns(asyncio.DatagramProtocol):
    """One box's resolver on its UDP socket (``BoxLink._udp``)."""

    def __init__(self, link: Any) -> None:
        self.link = link
        self.transport: asyncio.DatagramTransport | None = None
        self._tasks: set[asyncio.Task] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(self._tasks) >= 256:  # a box flooding its resolver: drop, it retries
            return
        task = asyncio.get_running_loop().create_task(self._answer(data, addr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, data: bytes, addr: tuple[str, int]) -> None:
        from dnslib import QTYPE, RCODE, RR, A, DNSRecord

        try:
            req = DNSRecord.parse(data)
            q = req.questions[0]
        except Exception:  # noqa: BLE001 - garbage from the box is dropped
            return
        name = str(q.qname).rstrip(".").lower()
        reply = req.reply()
        policy = self.link.policy
        # dnslib prints a dot or a backslash inside a label as it is: the one label "x.y" under
        # "corp" would read as the name x.y.corp; only labels of letters, digits, "-" and "_" are
        # checked against the policy at all
        if all(_DNS_LABEL.fullmatch(lab) for lab in q.qname.label) and policy.name_allowed(name):
            if q.qtype == QTYPE.A:
                try:
                    addrs = await resolve(name, self.link)
                    if addrs:
                        reply.add_answer(RR(q.qname, QTYPE.A, rdata=A(str(self.link.synth(name))), ttl=5))
                    else:
                        reply.header.rcode = RCODE.NXDOMAIN
                except ResolverBusy:  # the tenant's share of the resolver is taken: a client tries again
                    reply.header.rcode = RCODE.SERVFAIL
            # AAAA and others: an empty NOERROR answer (no IPv6 path exists)
        else:
            reply.header.rcode = RCODE.NXDOMAIN
            self.link.dns_denials.submit(self.link.record(kind="dns", host=name[:253], ip=None, port=None,
                                                          decision="denied",
                                                          reason="name not allowed by the network policy"),
                                         self.link.summarize_dns_denials)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(reply.pack(), addr)
