"""Host-side name resolution for the gateway (never the box's own resolver).

By default the system resolver (getaddrinfo, IPv4 only). EXECBOX_EGRESS_RESOLVER=HOST:PORT sends
queries to that DNS server instead (an internal resolver; the tests' fake internet). Every answer
is re-checked against the policy by the caller, so a lying resolver cannot unlock a denied range.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

LOOKUPS_PER_BOX = 4
"""Name lookups one box may have on the resolver's threads at once (more wait their turn): a box
asking for names whose servers never answer must not hold every thread while other boxes wait."""
_pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="execbox-resolve")
"""Lookups only (not the event loop's default executor, which other work of the gateway shares)."""


def _server() -> tuple[str, int] | None:
    raw = os.environ.get("EXECBOX_EGRESS_RESOLVER", "").strip()
    if not raw:
        return None
    host, _, port = raw.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host, int(port)


def resolve_sync(name: str) -> list[ipaddress.IPv4Address]:
    server = _server()
    out: list[ipaddress.IPv4Address] = []
    if server is not None:
        from dnslib import QTYPE, DNSRecord

        try:
            raw = DNSRecord.question(name, "A").send(server[0], server[1], timeout=3.0)
            for rr in DNSRecord.parse(raw).rr:
                if rr.rtype == QTYPE.A:
                    out.append(ipaddress.IPv4Address(str(rr.rdata)))
        except (OSError, ValueError, Exception):  # noqa: BLE001 - any failure is "does not resolve"
            return []
        return out
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    for info in infos:
        ip = ipaddress.IPv4Address(info[4][0])
        if ip not in out:
            out.append(ip)
    return out


async def resolve(name: str, box: Any = None) -> list[ipaddress.IPv4Address]:
    """Resolve on the resolver's own threads; a ``box`` (a gateway link or proxy state) holds at
    most LOOKUPS_PER_BOX of them at once, its further lookups wait on the event loop."""
    loop = asyncio.get_running_loop()
    if box is None:
        return await loop.run_in_executor(_pool, resolve_sync, name)
    slots = getattr(box, "lookup_slots", None)
    if slots is None:
        slots = box.lookup_slots = asyncio.Semaphore(LOOKUPS_PER_BOX)
    async with slots:
        return await loop.run_in_executor(_pool, resolve_sync, name)
