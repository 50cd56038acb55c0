"""The gateway's byte path: splice(2) between the box's socket and the upstream one.

Bytes move socket -> pipe -> socket inside the kernel, so the gateway never copies them into
Python: on a 2-core host this took the gateway's CPU per relayed megabyte to well under half of
a read/write relay's (docs/network.md, bench/bench_egress.py). Each direction is a small state
machine on the gateway's event loop: read (splice into its pipe) while the pipe is empty, drain
the pipe into the destination, and wait for the destination to become writable when it is full,
which passes back-pressure on to the sender. Counts bytes per direction into the audit record
and enforces the box's byte cap. Half-close (EOF) is forwarded; the pair is done when both
directions have ended, and either side failing ends both.

Connections whose bytes the gateway must see (credential injection, TLS terminated here) go
through ``relay_streams`` instead. Both kinds sit in their box's ``relays`` while they last, so a
box going, or a narrowing that no longer allows one (``cut_unlisted``), ends them at once.
"""

from __future__ import annotations

import asyncio
import fcntl
import ipaddress
import os
import socket
from collections.abc import Callable, Iterable
from typing import Any

from . import audit

PIPE_SIZE = 1 << 20
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, only exported from Python 3.10 on some builds
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


class _Direction:
    """One way of a relayed connection: ``src`` -> pipe -> ``dst``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, src: socket.socket, dst: socket.socket, link: Any,
                 rec: audit.AuditRecord, up: bool, ended: Callable[[bool], None]) -> None:
        self.loop, self.src, self.dst = loop, src, dst
        self.link, self.rec, self.up, self.ended = link, rec, up, ended
        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            fcntl.fcntl(self.w, F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:  # over the user's pipe quota: the default 64 KiB pipe still works
            pass
        self.pending = 0  # bytes in the pipe
        self.eof = False
        self.closed = False
        loop.add_reader(src.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            n = os.splice(self.src.fileno(), self.w, PIPE_SIZE, flags=_FLAGS)
        except BlockingIOError:
            return
        except OSError:
            self._end(failed=True)
            return
        if n == 0:
            self.eof = True
            self.loop.remove_reader(self.src.fileno())
            self._flush()
            return
        link = self.link
        link.bytes_total += n
        if self.up:
            self.rec.bytes_up += n
        else:
            self.rec.bytes_down += n
        if link.bytes_total > link.limits.max_bytes:
            self.rec.decision, self.rec.reason = "limited", f"byte cap of {link.limits.max_bytes} reached"
            self._end(failed=True)
            return
        self.pending += n
        self._flush()

    def _flush(self) -> None:
        while self.pending:
            try:
                self.pending -= os.splice(self.r, self.dst.fileno(), self.pending, flags=_FLAGS)
            except BlockingIOError:  # destination full: stop reading until it drains
                self.loop.remove_reader(self.src.fileno())
                self.loop.add_writer(self.dst.fileno(), self._writable)
                return
            except OSError:
                self._end(failed=True)
                return
        if self.eof:
            try:
                self.dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self._end(failed=False)

    def _writable(self) -> None:
        self.loop.remove_writer(self.dst.fileno())
        self._flush()
        if not self.pending and not self.eof and not self.closed:
            self.loop.add_reader(self.src.fileno(), self._readable)

    def _end(self, failed: bool) -> None:
        self.close()
        self.ended(failed)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.src.fileno())
        self.loop.remove_writer(self.dst.fileno())
        os.close(self.r)
        os.close(self.w)


class Spliced:
    """A relayed connection; ``abort()`` (box detached) ends both directions at once."""

    def __init__(self, loop: asyncio.AbstractEventLoop, box: socket.socket, upstream: socket.socket, link: Any,
                 rec: audit.AuditRecord) -> None:
        self.box, self.upstream, self.rec = box, upstream, rec
        self.done: asyncio.Future[bool] = loop.create_future()  # result: True when aborted or failed
        self._open = 2
        self.dirs = (_Direction(loop, box, upstream, link, rec, True, self._ended),
                     _Direction(loop, upstream, box, link, rec, False, self._ended))

    def _ended(self, failed: bool) -> None:
        self._open -= 1
        if failed or not self._open:
            self._finish(failed)

    def _finish(self, failed: bool) -> None:
        for d in self.dirs:
            d.close()
        if not self.done.done():
            self.done.set_result(failed)

    def abort(self) -> None:
        self._finish(True)

    @property
    def box_done(self) -> bool:
        """The box has ended its side (EOF): what is left is the upstream's tail to it."""
        return self.dirs[0].eof


class Narrowed(Exception):  # noqa: N818 - what happened, not an error of the code
    """The box's policy was narrowed while ``splice`` dialled: it no longer allows the connection."""


def _check_policy(link: Any, rec: audit.AuditRecord) -> None:
    """After each wait of ``splice``: the connection was decided under the policy of then."""
    policy = getattr(link, "policy", None)
    if policy is not None and not still_allowed(policy, rec):
        raise Narrowed(rec.reason)


async def splice(link: Any, box_transport: asyncio.Transport, host: str, port: int,
                 rec: audit.AuditRecord, connect_timeout: float, first: bytes = b"", *,
                 greeting: bytes = b"") -> None:
    """Dial ``host:port``, send ``first`` (a rewritten request head, say; counted as bytes up), then relay bytes between
    it and the (paused) box transport until both directions end. ``greeting`` goes to the box once
    the upstream is connected (the egress proxy's ``200 Connection established``). The box
    transport stays its owner's to close; an aborted relay aborts it.

    A narrowing that came while it waited (a connect takes up to ``connect_timeout``) and no
    longer allows ``rec``'s destination is ``Narrowed``, nothing relayed: the relay joins
    ``link.relays``, where a later narrowing finds it, only right after the last such check."""
    loop = asyncio.get_running_loop()
    upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    upstream.setblocking(False)
    try:
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.wait_for(loop.sock_connect(upstream, (host, port)), connect_timeout)
        _check_policy(link, rec)
        if first:
            await loop.sock_sendall(upstream, first)
            rec.bytes_up += len(first)  # box bytes like any other, only sent before the relay starts
            link.bytes_total += len(first)
    except BaseException:
        upstream.close()
        raise
    # The transport's own socket cannot be watched while the transport holds it: relay on a dup.
    box = socket.socket(fileno=os.dup(box_transport.get_extra_info("socket").fileno()))
    box.setblocking(False)
    if greeting:
        try:
            await loop.sock_sendall(box, greeting)
        except BaseException:
            upstream.close()
            box.close()
            raise
    try:
        _check_policy(link, rec)
    except Narrowed:
        upstream.close()
        box.close()
        raise
    relay = Spliced(loop, box, upstream, link, rec)
    relays = getattr(link, "relays", None)
    if relays is not None:
        relays.add(relay)
    try:
        aborted = await relay.done
    finally:
        relay.abort()
        if relays is not None:
            relays.discard(relay)
        upstream.close()
        box.close()
    if aborted:
        box_transport.abort()


class _Streams:
    """An entry of a box's ``relays`` for a connection relayed by ``relay_streams``."""

    def __init__(self, rec: audit.AuditRecord, *writers: asyncio.StreamWriter) -> None:
        self.rec, self.writers = rec, writers

    def abort(self) -> None:
        for w in self.writers:
            w.transport.abort()


async def _pipe(link: Any, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                rec: audit.AuditRecord, up: bool, edit: Any = None, seen: list[float] | None = None) -> None:
    """Copy ``src`` to ``dst`` until EOF, counting and capping. ``edit`` (the injector's request
    framing or secret scrubbing) turns each chunk read into the bytes to send (``feed``), gives
    what it held back at EOF (``end``), and raises ValueError, saying why, to end the connection.
    ``seen[0]``: when a byte last came in either way (``relay_streams``' idle timeout)."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            data = await src.read(1 << 18)
            if seen is not None:
                seen[0] = loop.time()
            if not data:
                break
            n = len(data)
            link.bytes_total += n
            if up:
                rec.bytes_up += n
            else:
                rec.bytes_down += n
            if link.bytes_total > link.limits.max_bytes:
                rec.decision, rec.reason = "limited", f"byte cap of {link.limits.max_bytes} reached"
                dst.transport.abort()
                return
            if edit is not None:
                try:
                    data = edit.feed(data)
                except ValueError as e:
                    rec.reason = f"{rec.reason}; {e}" if rec.reason else str(e)
                    return
            if data:
                dst.write(data)
                await dst.drain()
        if edit is not None and (tail := edit.end()):
            dst.write(tail)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()
    except (OSError, RuntimeError):
        pass


async def relay_streams(link: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        up_r: asyncio.StreamReader, up_w: asyncio.StreamWriter, rec: audit.AuditRecord, *,
                        up_edit: Any = None, down_edit: Any = None, idle: float | None = None) -> None:
    """Relay between two stream pairs through Python (the bytes are plaintext the gateway
    rewrote, so splice(2) does not apply), counting and capping like ``splice``; ``up_edit`` and
    ``down_edit`` see the bytes of each way (``_pipe``).

    The pair ends as soon as either way does. A box's TLS side cannot be half-closed (asyncio
    closes a TLS transport at EOF, and ``write_eof`` is not possible on one), so once the box
    has closed there is nobody to deliver to: the upstream is closed too, instead of holding the
    box's connection slot, and its audit row, until the upstream gives up (an upstream that
    ignores ``Connection: close`` never does). An upstream that has ended ends the box's side
    (its caller closes it), which is how a response delimited by the close reaches its end.
    ``idle``: seconds with no byte either way after which both are closed."""
    loop = asyncio.get_running_loop()
    entry = _Streams(rec, writer, up_w)
    link._writers.add(up_w)
    link.relays.add(entry)
    seen = [loop.time()]
    box_way = asyncio.ensure_future(_pipe(link, reader, up_w, rec, True, up_edit, seen))
    up_way = asyncio.ensure_future(_pipe(link, up_r, writer, rec, False, down_edit, seen))
    try:
        while True:
            left = None if idle is None else seen[0] + idle - loop.time()
            if left is not None and left <= 0:
                note = f"closed after {idle:g} s with no bytes either way"
                rec.reason = f"{rec.reason}; {note}" if rec.reason else note
                break
            done, _ = await asyncio.wait((box_way, up_way), timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if done:
                break
    finally:
        for way in (box_way, up_way):
            way.cancel()
        link.relays.discard(entry)
        link._writers.discard(up_w)
        if up_way.done() and not up_way.cancelled():
            up_w.close()
        else:
            up_w.transport.abort()


NARROWED = "cut: the network policy was narrowed and no longer allows it"


def still_allowed(policy: Any, rec: audit.AuditRecord) -> bool:
    """Would ``policy`` let the connection of ``rec`` (open, so its address is known) be made now?
    The same test as ``gateway.decide`` without the lookup: a name and its address."""
    if rec.ip is None or rec.port is None:
        return False
    ip = ipaddress.IPv4Address(rec.ip)
    if rec.host is not None:
        return policy.name_allowed(rec.host, rec.port) and policy.ip_allowed(ip, rec.port, via_name=True)[0]
    return policy.ip_allowed(ip, rec.port)[0]


def cut_unlisted(relays: Iterable[Any], policy: Any, reason: str = NARROWED) -> int:
    """End the relayed connections ``policy`` no longer allows (on the gateway's loop); their
    records say so (``limited``). One whose box had already ended its side (a finished request
    whose response was still arriving, e.g. right after an install step) keeps its decision,
    with the cut noted in its reason. Returns how many."""
    cut = 0
    for r in list(relays):
        if not still_allowed(policy, r.rec):
            if getattr(r, "box_done", False):
                note = f"{reason} (after the box had finished sending)"
                r.rec.reason = f"{r.rec.reason}; {note}" if r.rec.reason else note
            else:
                r.rec.decision, r.rec.reason = "limited", reason
            r.abort()
            cut += 1
    return cut
