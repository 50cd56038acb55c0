"""The attach stream (demultiplexer, sends, end of stream), over a real socket pair."""

from __future__ import annotations

import socket
import struct
import threading
import time

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


BIG = 16 << 20  # review 40's upload: 16 MiB, far more than a socket buffer holds


def _send_in_thread(t: AttachTransport, data: bytes) -> tuple[threading.Thread, dict]:
    res: dict = {}

    def go() -> None:
        t0 = time.monotonic()
        try:
            t.send(data)
            res["ok"] = True
        except OSError as e:
            res["error"] = e
        res["seconds"] = time.monotonic() - t0

    th = threading.Thread(target=go, daemon=True)
    th.start()
    return th, res


def test_a_send_fails_at_once_when_the_stream_ends_while_its_peer_stops_reading():
    """A killed container: dockerd closes what it sends us (EOF) but stops draining what we send.
    A blocking sendall then waited until dockerd dropped the connection (78-108 s in review 40)."""
    a, b = socket.socketpair()
    t = AttachTransport(a)
    th, res = _send_in_thread(t, b"x" * BIG)
    time.sleep(0.2)  # the send fills the buffers and waits
    b.shutdown(socket.SHUT_WR)  # EOF for our reader; nobody reads what we send
    th.join(3)
    try:
        assert not th.is_alive(), "the send did not notice that the stream ended"
        assert isinstance(res.get("error"), OSError) and res["seconds"] < 3
        assert t.ended()
    finally:
        b.close()  # frees a blocked sendall (the old code) too
        th.join(5)
        t.close()


def test_a_stalled_send_gives_up_once_the_container_is_not_running(monkeypatch):
    """No EOF, no progress: after STALL_PROBE seconds the send asks the engine (``probe``)."""
    from execbox.boxes import docker_attach

    monkeypatch.setattr(docker_attach, "STALL_PROBE", 0.2, raising=False)
    a, b = socket.socketpair()
    t = AttachTransport(a)
    running = [True]
    t.probe = lambda: running[0]
    th, res = _send_in_thread(t, b"x" * BIG)
    time.sleep(0.6)
    try:
        assert th.is_alive(), "a live container's slow reader must not fail the send"
        running[0] = False
        th.join(3)
        assert not th.is_alive() and isinstance(res.get("error"), OSError)
    finally:
        b.close()
        th.join(5)
        t.close()


def test_a_send_completes_while_the_peer_reads_and_talks_back():
    """What a send reads off the stream (to see an EOF) reaches the reader afterwards, in order."""
    a, b = socket.socketpair()
    t = AttachTransport(a)
    got = bytearray()

    def peer() -> None:
        b.sendall(frame(1, b"early"))
        while len(got) < BIG:
            got.extend(b.recv(1 << 16))
        b.sendall(frame(1, b" reply"))

    th = threading.Thread(target=peer, daemon=True)
    th.start()
    t.send(b"y" * BIG)
    th.join(10)
    assert len(got) == BIG
    out = b""
    while len(out) < 11:
        out += t.recv(100, 2.0)
    assert out == b"early reply"
    b.close()
    t.close()


def test_ended_sees_the_end_of_an_idle_stream_without_losing_its_bytes():
    """What the warm pool asks before handing out a box that nobody has read since it started."""
    a, b = socket.socketpair()
    t = AttachTransport(a)
    assert not t.ended()
    b.sendall(frame(1, b"last words"))
    assert not t.ended()
    b.close()
    assert t.ended()
    assert t.recv(100, 1.0) == b"last words"
    assert t.recv(100, 1.0) == b""
    t.close()
