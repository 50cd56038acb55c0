"""One box's lookups of names whose servers never answer hold at most LOOKUPS_PER_BOX resolver
threads; other boxes' lookups go on (they shared the event loop's small default pool before:
a pod resolving black-holed names stalled every box's DNS for 30 s)."""

from __future__ import annotations

import asyncio
import ipaddress
import threading
import types

from execbox.egress import resolver


def test_a_box_with_stuck_lookups_does_not_hold_up_another(monkeypatch):
    release = threading.Event()
    in_flight: list[str] = []
    lock = threading.Lock()

    def fake(name: str) -> list[ipaddress.IPv4Address]:
        if name.endswith(".slow.test"):
            with lock:
                in_flight.append(name)
            release.wait(10)
        return [ipaddress.IPv4Address("203.0.113.5")]

    monkeypatch.setattr(resolver, "resolve_sync", fake)
    attacker, victim = types.SimpleNamespace(), types.SimpleNamespace()

    async def go() -> tuple[int, list[ipaddress.IPv4Address]]:
        stuck = [asyncio.create_task(resolver.resolve(f"n{i}.slow.test", attacker)) for i in range(100)]
        await asyncio.sleep(0.2)
        got = await asyncio.wait_for(resolver.resolve("good.test", victim), 5)  # not queued behind them
        held = len(in_flight)
        release.set()
        await asyncio.gather(*stuck)
        return held, got

    held, got = asyncio.run(go())
    assert held == resolver.LOOKUPS_PER_BOX  # the attacker's share of the threads, the rest waited
    assert got == [ipaddress.IPv4Address("203.0.113.5")]
    assert len(in_flight) == 100  # every one was answered in the end
