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
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

POOL_SIZE = 64
LOOKUPS_PER_BOX = 4
"""Name lookups one box may have on the resolver's threads at once (more wait their turn): a box
asking for names whose servers never answer must not hold every thread while other boxes wait."""
LOOKUPS_PER_TENANT = 16
"""... and all boxes of one tenant together: past it a lookup fails at once (``ResolverBusy``)
instead of waiting, so sixteen boxes of one tenant cannot hold the whole pool. A slot is held
until its thread is done, even when the lookup's caller gave up (a cut connection)."""
_pool = ThreadPoolExecutor(max_workers=POOL_SIZE, thread_name_prefix="execbox-resolve")
"""Lookups only (not the event loop's default executor, which other work of the gateway shares)."""
_tenants: dict[str, int] = {}  # threads held per tenant
_tenants_lock = threading.Lock()


class ResolverBusy(Exception):  # noqa: N818 - a state, not a bug
    """The tenant holds its share of the resolver's threads already (its names are slow to answer)."""


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
    most LOOKUPS_PER_BOX of them at once, its further lookups wait on the event loop, and its
    tenant (``box.tenant_id``, when known) at most LOOKUPS_PER_TENANT, else ``ResolverBusy``."""
    loop = asyncio.get_running_loop()
    if box is None:
        return await loop.run_in_executor(_pool, resolve_sync, name)
    slots = getattr(box, "lookup_slots", None)
    if slots is None:
        slots = box.lookup_slots = asyncio.Semaphore(LOOKUPS_PER_BOX)
    await slots.acquire()
    tenant = getattr(box, "tenant_id", None)
    if tenant is not None:
        with _tenants_lock:
            held = _tenants.get(tenant, 0)
            if held >= LOOKUPS_PER_TENANT:
                slots.release()
                raise ResolverBusy(f"the gateway's resolver is busy with {held} lookups of this tenant "
                                   f"(at most {LOOKUPS_PER_TENANT} at once)")
            _tenants[tenant] = held + 1
    released = threading.Event()

    def release() -> None:  # once, from the thread that ran the lookup or the cancelled job's callback
        if released.is_set():
            return
        released.set()
        if tenant is not None:
            with _tenants_lock:
                left = _tenants.pop(tenant, 1) - 1
                if left > 0:
                    _tenants[tenant] = left
        try:
            loop.call_soon_threadsafe(slots.release)
        except RuntimeError:  # the loop is closed (a test's own loop): nobody waits on it any more
            pass

    def lookup() -> list[ipaddress.IPv4Address]:
        try:
            return resolve_sync(name)
        finally:
            release()

    try:
        job = _pool.submit(lookup)
    except BaseException:  # the pool is shut down: the slots taken above would be held for good
        release()
        raise
    job.add_done_callback(lambda j: j.cancelled() and release())  # never started: its slots come back
    return await asyncio.wrap_future(job, loop=loop)
