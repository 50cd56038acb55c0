"""The gateway's byte path: two asyncio Protocols handing data straight to each other.

No StreamReader buffering or per-chunk coroutine: ``data_received`` writes into the other
transport, and the kernel-level back-pressure is passed on (a full write buffer pauses reading on
the other side). Counts bytes per direction into the audit record and enforces the box's byte
cap. Half-close (EOF) is forwarded; the pair is done when both sides are closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from . import audit

HIGH_WATER = 1 << 20


class Relay(asyncio.Protocol):
    def __init__(self, link: Any, rec: audit.AuditRecord, up: bool) -> None:
        self.link = link
        self.rec = rec
        self.up = up  # True: box -> upstream
        self.transport: asyncio.Transport | None = None
        self.other: Relay | None = None
        self.eof = False
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=HIGH_WATER)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        other = self.other
        if other is None or other.transport is None:
            return
        n = len(data)
        link = self.link
        link.bytes_total += n
        if self.up:
            self.rec.bytes_up += n
        else:
            self.rec.bytes_down += n
        if link.bytes_total > link.limits.max_bytes:
            self.rec.decision, self.rec.reason = "limited", f"byte cap of {link.limits.max_bytes} reached"
            self.abort()
            return
        other.transport.write(data)

    def eof_received(self) -> bool:
        self.eof = True
        other = self.other
        if other is not None and other.transport is not None and other.transport.can_write_eof():
            try:
                other.transport.write_eof()
            except OSError:
                pass
        if other is None or other.eof:
            self.close()
            return False
        return True  # keep reading the other direction

    # our transport's write buffer is full: stop reading from the side that feeds it
    def pause_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        if self.other is not None and self.other.transport is not None:
            self.other.transport.close()

    def close(self) -> None:
        for r in (self, self.other):
            if r is not None and r.transport is not None:
                r.transport.close()

    def abort(self) -> None:
        for r in (self, self.other):
            if r is not None and r.transport is not None:
                r.transport.abort()


async def splice(link: Any, box_transport: asyncio.Transport, host: str, port: int,
                 rec: audit.AuditRecord, connect_timeout: float, *, first_up: bytes = b"",
                 greeting: bytes = b"") -> None:
    """Dial ``host:port`` and relay bytes between it and the (paused) box transport until both close.

    Once connected, ``greeting`` goes to the box (the egress proxy's ``200 Connection established``)
    and ``first_up`` upstream (bytes the proxy already read from the box: a rewritten request head)."""
    loop = asyncio.get_running_loop()
    down = Relay(link, rec, up=False)
    up_t, _ = await asyncio.wait_for(loop.create_connection(lambda: down, host, port), connect_timeout)
    up = Relay(link, rec, up=True)
    up.other, down.other = down, up
    box_transport.set_protocol(up)
    up.connection_made(box_transport)
    if greeting:
        box_transport.write(greeting)
    if first_up:
        up.data_received(first_up)
    box_transport.resume_reading()
    await asyncio.gather(up.closed, down.closed)
