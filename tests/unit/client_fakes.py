"""Hostile HTTP servers for the client tests: raw sockets, so every byte (and every pause) is the
test's. A handler gets the connection and the request; ``stopped`` ends its loops on ``stop()``."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

Handler = Callable[["RawServer", socket.socket, str, str, bytes], None]


class RawServer:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.stopped = threading.Event()
        self.requests: list[tuple[str, str]] = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            buf = b""
            while b"\r\n\r\n" not in buf:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
            head, body = buf.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = next((int(v) for k, _, v in (ln.partition(":") for ln in lines[1:])
                           if k.strip().lower() == "content-length"), 0)
            while len(body) < length:
                body += conn.recv(65536)
            self.requests.append((method, path))
            self.handler(self, conn, method, path, body)
        except OSError:
            pass
        finally:
            conn.close()

    def pause(self, seconds: float) -> None:
        """Sleep, unless the server is stopping (a trickling handler's loop)."""
        if self.stopped.wait(seconds):
            raise OSError("server stopped")

    def stop(self) -> None:
        self.stopped.set()
        self.sock.close()


def send(conn: socket.socket, status: str, body: bytes | str, ctype: str = "application/json",
         extra: str = "") -> None:
    data = body.encode() if isinstance(body, str) else body
    conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n{extra}"
                 "Connection: close\r\n\r\n".encode() + data)


def answer(body: bytes | str, status: str = "200 OK", ctype: str = "application/json", extra: str = "") -> Handler:
    """A handler that answers every request with ``body`` (whoami gets a tenant)."""

    def handle(srv: RawServer, conn: socket.socket, method: str, path: str, _body: bytes) -> None:
        if path.endswith("/whoami"):
            return send(conn, "200 OK", '{"tenant_id": "t", "role": "tenant"}')
        send(conn, status, body, ctype, extra)

    return handle


def trickle_body(srv: RawServer, conn: socket.socket, *_: Any) -> None:
    """200, chunked, one byte every 0.2 s forever: each read is well within any read timeout."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    while True:
        conn.sendall(b"1\r\n \r\n")
        srv.pause(0.2)


def trickle_headers(srv: RawServer, conn: socket.socket, *_: Any) -> None:
    """The status line, then a header one byte every 0.2 s: the body never starts."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    while True:
        conn.sendall(b"a")
        srv.pause(0.2)


def keepalives_forever(srv: RawServer, conn: socket.socket, *_: Any) -> None:
    """An SSE stream of keep-alive comments every 0.2 s, never a result."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    while True:
        conn.sendall(b"d\r\n: keepalive\n\n\r\n")
        srv.pause(0.2)


def in_thread(fn: Callable[[], Any], limit: float) -> tuple[Any, BaseException | None, float]:
    """``fn()`` on a daemon thread: (value, exception, seconds); AssertionError if still running
    after ``limit`` seconds (the client hung)."""
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    started = time.monotonic()
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(limit)
    took = time.monotonic() - started
    assert not t.is_alive(), f"the client was still waiting after {took:.0f}s: no overall deadline"
    return box.get("value"), box.get("error"), took


@pytest.fixture
def serve():
    servers: list[RawServer] = []

    def start(handler) -> RawServer:
        servers.append(RawServer(handler))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()
