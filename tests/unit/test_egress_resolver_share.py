"""The resolver's threads are shared by every box of the process: one tenant's boxes asking for
names whose servers never answer hold at most LOOKUPS_PER_TENANT of them (past it a lookup fails at
once, SERVFAIL to the box), so another tenant's lookups still run. Found by review: 16 boxes x 4
lookups each held all 64 threads, and every box's DNS waited behind them."""

from __future__ import annotations

import asyncio
import ipaddress
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from dnslib import RCODE, DNSRecord

from execbox.egress import box_dns, resolver
from execbox.egress import gateway as gw
from execbox.egress.policy import parse_policy

ADDR = ipaddress.IPv4Address("203.0.113.7")


def _run(main) -> object:
    with ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, main()).result(60)


def test_one_tenant_s_blackholed_names_do_not_starve_another_tenant(monkeypatch):
    release, others = threading.Event(), threading.Event()

    def lookup(name: str) -> list[ipaddress.IPv4Address]:
        if name.startswith("blackhole"):
            release.wait(30)  # a server that never answers
        else:
            others.set()
        return [ADDR]

    monkeypatch.setattr(resolver, "resolve_sync", lookup)
    pool = resolver._pool._max_workers  # noqa: SLF001
    boxes = [SimpleNamespace(tenant_id="flooder", lookup_slots=None) for _ in range(pool // resolver.LOOKUPS_PER_BOX)]
    got: dict[str, object] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        held = [asyncio.ensure_future(resolver.resolve(f"blackhole{i}.test", box))
                for i, box in enumerate(boxes) for _ in range(resolver.LOOKUPS_PER_BOX)]  # enough for the pool
        await asyncio.sleep(0)
        other = asyncio.ensure_future(resolver.resolve("api.example.com", SimpleNamespace(tenant_id="victim")))
        got["victim ran"] = await loop.run_in_executor(None, others.wait, 20)  # a hang guard, not a timing
        got["victim"] = await other
        busy = [t for t in held if t.done() and isinstance(t.exception(), resolver.ResolverBusy)]
        got["busy"] = len(busy)
        waiting = [t for t in held if not t.done()]
        waiting[0].cancel()  # a caller that gave up: its thread still waits, so its slot stays taken
        await asyncio.sleep(0)
        got["held"] = resolver._tenants.get("flooder")  # noqa: SLF001
        release.set()
        await asyncio.gather(*waiting, return_exceptions=True)
        while resolver._tenants:  # noqa: SLF001 - the threads give their slots back as they end
            await asyncio.sleep(0.01)

    try:
        _run(main)
    finally:
        release.set()
    assert got["victim ran"] and got["victim"] == [ADDR]
    assert got["held"] == resolver.LOOKUPS_PER_TENANT
    assert got["busy"] == len(boxes) * resolver.LOOKUPS_PER_BOX - resolver.LOOKUPS_PER_TENANT


def test_a_tenant_over_its_share_gets_servfail_and_a_refusal_that_says_why(monkeypatch):
    monkeypatch.setitem(resolver._tenants, "t-busy", resolver.LOOKUPS_PER_TENANT)  # noqa: SLF001
    link = gw.BoxLink("b", parse_policy("allowlist", ["api.example.com"]), gw.Limits(), None, None)
    link.tenant_id = "t-busy"
    sent: list[bytes] = []
    dns = box_dns.BoxDns(link)
    dns.transport = SimpleNamespace(is_closing=lambda: False, sendto=lambda data, addr: sent.append(data))

    async def main() -> object:
        await dns._answer(DNSRecord.question("api.example.com").pack(), ("198.18.255.2", 5353))  # noqa: SLF001
        return await gw.decide(link, "api.example.com", None, 443)

    target, why = _run(main)
    assert DNSRecord.parse(sent[0]).header.rcode == RCODE.SERVFAIL
    assert target is None and "resolver is busy" in why


def test_a_lookup_the_pool_refuses_gives_its_slots_back(monkeypatch):
    """Review 53 F3: the box's and the tenant's slots were taken before the pool's submit; a pool
    that refused (shut down) kept them for good."""
    dead = ThreadPoolExecutor(1)
    dead.shutdown()
    monkeypatch.setattr(resolver, "_pool", dead)
    box = SimpleNamespace(tenant_id="t-refused")

    async def main() -> None:
        for _ in range(resolver.LOOKUPS_PER_TENANT + 1):
            try:
                await asyncio.wait_for(resolver.resolve("x.example", box), 5)  # a held slot: TimeoutError
            except RuntimeError:  # "cannot schedule new futures after shutdown"
                pass
            await asyncio.sleep(0)  # the box slot comes back through the loop

    _run(main)
    assert resolver._tenants.get("t-refused", 0) == 0
    assert box.lookup_slots._value == resolver.LOOKUPS_PER_BOX
