"""The host end of a box container's attach stream: Docker's 8-byte stream frames demultiplexed
(no TTY), stdout to the agent client, a tail of stderr kept for start-up errors. Split from
docker_box.py, which creates and removes the containers.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from .agent_client import wait_readable

STDOUT, STDERR = 1, 2
STDERR_TAIL = 8192


class AttachTransport:
    """Transport over a hijacked ``attach`` connection: demultiplexes Docker's stream frames."""

    def __init__(self, sock: Any) -> None:
        self._holder = sock  # the SDK's SocketIO keeps the HTTP response (and socket) alive
        self.sock: socket.socket = getattr(sock, "_sock", sock)
        self.sock.setblocking(True)
        self._raw = bytearray()
        self._out = bytearray()
        self.stderr_tail = bytearray()
        self._eof = False
        self._closed = False

    def send(self, data: bytes) -> None:
        if self._closed:
            raise OSError("attach stream closed")
        self.sock.sendall(data)

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
