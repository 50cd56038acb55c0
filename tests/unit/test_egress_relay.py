"""The gateway's splice relay (egress/relay.py) between real loopback TCP sockets.

A "box" client connects to a listener whose accepted transport is handed (paused) to
``relay.splice``, as the gateway does; the upstream is a plain server socket the test drives.
"""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

from execbox.egress import relay
from execbox.egress.audit import AuditRecord


def _run(main) -> None:
    """asyncio.run in a thread of its own: earlier tests in the same process (Playwright's sync
    API) can leave an event loop marked running in the main thread."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as ex:
        ex.submit(asyncio.run, main()).result(30)


def _link(max_bytes: int = 1 << 30) -> SimpleNamespace:
    return SimpleNamespace(bytes_total=0, limits=SimpleNamespace(max_bytes=max_bytes), relays=set())


async def _start(link: SimpleNamespace, rec: AuditRecord, first: bytes = b""):
    """(box client socket, accepted upstream socket, relay task)."""
    loop = asyncio.get_running_loop()
    upstream_srv = socket.create_server(("127.0.0.1", 0))
    upstream_srv.setblocking(False)
    up_port = upstream_srv.getsockname()[1]
    started: asyncio.Future = loop.create_future()

    def on_box(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.pause_reading()
        task = asyncio.ensure_future(relay.splice(link, writer.transport, "127.0.0.1", up_port, rec, 5.0, first))
        task.add_done_callback(lambda _t: writer.close())
        started.set_result(task)

    box_srv = await asyncio.start_server(on_box, "127.0.0.1", 0)
    box = socket.create_connection(box_srv.sockets[0].getsockname()[:2])
    box.setblocking(False)
    task = await asyncio.wait_for(started, 5)
    up, _ = await asyncio.wait_for(loop.sock_accept(upstream_srv), 5)
    box_srv.close()
    upstream_srv.close()
    return box, up, task


async def _read_all(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    out = bytearray()
    while chunk := await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 5):
        out += chunk
    return bytes(out)


def test_bytes_both_ways_half_close_and_counts():
    async def main():
        loop = asyncio.get_running_loop()
        link, rec = _link(), AuditRecord(box="b", kind="tcp", host=None, ip=None, port=None)
        box, up, task = await _start(link, rec, first=b"HEAD\r\n")
        payload = bytes(range(256)) * 20000  # 5 MB, more than one pipe's worth
        await loop.sock_sendall(box, payload)
        box.shutdown(socket.SHUT_WR)  # the box is done sending: upstream must see EOF
        got = await _read_all(up)
        assert got == b"HEAD\r\n" + payload
        await loop.sock_sendall(up, b"reply" * 1000)
        up.close()
        assert await _read_all(box) == b"reply" * 1000
        await asyncio.wait_for(task, 5)
        box.close()
        assert (rec.bytes_up, rec.bytes_down) == (len(b"HEAD\r\n") + len(payload), 5000)
        assert link.bytes_total == len(b"HEAD\r\n") + len(payload) + 5000 and not link.relays
    _run(main)


def test_byte_cap_cuts_the_connection():
    async def main():
        loop = asyncio.get_running_loop()
        link, rec = _link(max_bytes=1 << 20), AuditRecord(box="b", kind="tcp", host=None, ip=None, port=None)
        box, up, task = await _start(link, rec)
        try:
            await asyncio.wait_for(loop.sock_sendall(up, b"x" * (4 << 20)), 5)
        except (ConnectionError, TimeoutError):
            pass
        await asyncio.wait_for(task, 5)
        got = await _read_all(box)
        assert len(got) <= 1 << 20
        assert rec.decision == "limited" and "byte cap" in rec.reason
        box.close()
        up.close()
    _run(main)


def test_abort_from_the_link_closes_both_sides():
    """What the gateway does when a box is destroyed mid-connection (Gateway._detach)."""
    async def main():
        link, rec = _link(), AuditRecord(box="b", kind="tcp", host=None, ip=None, port=None)
        box, up, task = await _start(link, rec)
        await asyncio.sleep(0.05)
        assert len(link.relays) == 1
        for r in list(link.relays):
            r.abort()
        await asyncio.wait_for(task, 5)
        assert await _read_all(up) == b""  # upstream sees the end
        try:  # the box's connection ends too (FIN, or a reset)
            assert await _read_all(box) == b""
        except ConnectionError:
            pass
        box.close()
        up.close()
    _run(main)
