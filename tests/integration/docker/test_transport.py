"""The attach-stream demultiplexer, over a real socket pair."""

from __future__ import annotations

import socket
import struct

import pytest

from execbox.boxes.docker_box import AttachTransport


def frame(kind: int, payload: bytes) -> bytes:
    return bytes([kind, 0, 0, 0]) + struct.pack(">I", len(payload)) + payload


def test_demux_splits_stdout_from_stderr_across_partial_reads():
    a, b = socket.socketpair()
    t = AttachTransport(a)
    data = frame(1, b"hello ") + frame(2, b"warn") + frame(1, b"world")
    b.sendall(data[:5])
    with pytest.raises(TimeoutError):
        t.recv(100, 0.05)
    b.sendall(data[5:])
    got = b""
    while len(got) < 11:
        got += t.recv(100, 1.0)
    assert got == b"hello world"
    assert bytes(t.stderr_tail) == b"warn"
    t.send(b"ping")
    assert b.recv(10) == b"ping"
    b.close()
    assert t.recv(100, 1.0) == b""  # EOF
    t.close()
