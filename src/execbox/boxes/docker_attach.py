"""The host end of a box container's attach stream: Docker's 8-byte stream frames demultiplexed
(no TTY), stdout to the agent client, a tail of stderr kept for start-up errors. Split from
docker_box.py, which creates and removes the containers.

Sends never block blind: a request (a 16 MiB upload, say) goes out in pieces, each after poll(2)
says the socket can take more, and while it waits the stream's read side is watched too. When a
container dies, dockerd closes what it sends us (EOF) but may stop draining what we send long
before it closes the connection: a plain ``sendall`` then hung for 78-108 s (review 40) holding
the box's write lock, and the session looked busy. Now an EOF seen during a send fails it at once,
and a send that makes no progress for ``STALL_PROBE`` seconds asks ``probe`` (the engine: is the
container still running?).
"""

from __future__ import annotations

import errno
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from .agent_client import wait_readable

STDOUT, STDERR = 1, 2
STDERR_TAIL = 8192
SEND_CHUNK = 1 << 20
"""Most bytes handed to one non-blocking send."""
SEND_POLL = 0.25
"""Seconds one poll of a stalled send waits before it looks again (EOF wakes it at once)."""
STALL_PROBE = 2.0
"""Seconds without progress after which a send asks ``probe`` whether the container still runs
(then again every as many seconds). A live agent busy elsewhere only slows a send; a dead one
fails it."""
DRAIN_MAX = 1 << 20
"""Most bytes one non-blocking drain takes off the read side (see ``_drain_nowait``)."""

_RDHUP = getattr(select, "POLLRDHUP", 0)


def open_attach(api: Any, container_id: str, probe: Callable[[], bool] | None = None) -> AttachTransport:
    """A new attach stream (stdin, stdout, stderr) to a container's main process, the agent."""
    sock = api.attach_socket(container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
    return AttachTransport(sock, probe)


class StreamClosed(BrokenPipeError):
    """The attach stream ended (or the container stopped) while a request was being sent."""


class AttachTransport:
    """Transport over a hijacked ``attach`` connection: demultiplexes Docker's stream frames.

    One reader at a time (the agent client's), any number of senders (one at a time, under the
    client's write lock), and ``ended()`` from anyone: the read side is guarded by ``_read_lock``,
    which a send or ``ended()`` only ever try-acquires, so what they read is buffered here for the
    reader, never lost."""

    def __init__(self, sock: Any, probe: Callable[[], bool] | None = None) -> None:
        self._holder = sock  # the SDK's SocketIO keeps the HTTP response (and socket) alive
        self.sock: socket.socket = getattr(sock, "_sock", sock)
        self.sock.setblocking(True)
        self._raw = bytearray()
        self._out = bytearray()
        self.stderr_tail = bytearray()
        self._eof = False
        self._closed = False
        self._read_lock = threading.Lock()
        self.probe = probe  # True while the container runs (docker_box sets it); None: never asked
        # TLS (a tcp:// engine with certificates) buffers inside the SSL object: poll and
        # MSG_DONTWAIT do not apply; it keeps a plain blocking send.
        self._plain = not isinstance(self.sock, ssl.SSLSocket)

    def send(self, data: bytes) -> None:
        if self._closed:
            raise OSError("attach stream closed")
        if not self._plain:
            self.sock.sendall(data)
            return
        view = memoryview(data)
        fd = self.sock.fileno()
        progress = time.monotonic()
        next_probe = progress + STALL_PROBE
        watch_read = True
        while view:
            if self._eof:
                raise StreamClosed(errno.EPIPE, "attach stream closed: the box's agent exited")
            poller = select.poll()
            poller.register(fd, select.POLLOUT | ((select.POLLIN | _RDHUP) if watch_read else 0))
            events = 0
            for _fd, ev in poller.poll(SEND_POLL * 1000):
                events |= ev
            watch_read = True
            if events & select.POLLNVAL:
                raise OSError(errno.EBADF, "attach stream closed")
            if events & (select.POLLIN | _RDHUP | select.POLLHUP | select.POLLERR):
                if not self._drain_nowait():
                    watch_read = False  # the reader has it (and sees an EOF): wait on POLLOUT a while
                if self._eof:
                    continue
            if events & (select.POLLOUT | select.POLLERR | select.POLLHUP):
                try:
                    sent = self.sock.send(view[:SEND_CHUNK], socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                if sent:
                    view = view[sent:]
                    progress = time.monotonic()
                    next_probe = progress + STALL_PROBE
                    continue
            now = time.monotonic()
            if self.probe is not None and now >= next_probe:
                next_probe = now + STALL_PROBE
                if not self.probe():
                    raise StreamClosed(errno.EPIPE, f"the box's container stopped (no byte of the request "
                                                    f"taken for {now - progress:.0f}s)")

    def ended(self) -> bool:
        """Has the stream ended (the agent exited, the container or the engine went)? Never waits.

        What arrived meanwhile is kept for the reader. While a reader is on the stream this says
        False: that reader sees an EOF itself."""
        if self._closed or self._eof:
            return True
        try:
            readable = wait_readable(self.sock.fileno(), 0)
        except (OSError, ValueError):
            return True
        if readable:
            self._drain_nowait()
        return self._eof

    def _drain_nowait(self) -> bool:
        """Take what has arrived off the socket without waiting, into the demux buffers; False when
        another thread is reading (it gets the bytes, and the EOF, itself)."""
        if not self._read_lock.acquire(blocking=False):
            return False
        try:
            taken = 0
            while not self._eof and taken < DRAIN_MAX:
                try:
                    chunk = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:  # reset: as good as closed
                    self._eof = True
                    break
                if not chunk:
                    self._eof = True
                    break
                taken += len(chunk)
                self._raw += chunk
                self._demux()
        finally:
            self._read_lock.release()
        return True

    def _demux(self) -> None:
        raw = self._raw
        while len(raw) >= 8:
            kind, size = raw[0], struct.unpack(">I", raw[4:8])[0]
            if len(raw) < 8 + size:
                return
            payload = raw[8 : 8 + size]
            if kind == STDERR:
                self.stderr_tail += payload
                del self.stderr_tail[:-STDERR_TAIL]
            else:
                self._out += payload
            del raw[: 8 + size]

    def recv(self, max_bytes: int, timeout: float) -> bytes:
        deadline = time.monotonic() + max(0.0, timeout)
        with self._read_lock:
            while not self._out:
                if self._eof or self._closed:
                    return b""
                remaining = deadline - time.monotonic()
                if not wait_readable(self.sock.fileno(), remaining):
                    raise TimeoutError
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    self._eof = True
                    continue
                self._raw += chunk
                self._demux()
            out = bytes(self._out[:max_bytes])
            del self._out[:max_bytes]
            return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for obj in (self.sock, self._holder):
            try:
                obj.close()
            except OSError:
                pass
