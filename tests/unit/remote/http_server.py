"""Real HTTP servers for tests: uvicorn in a thread on a free loopback port."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThreadedServer:
    """uvicorn serving ``app`` in a daemon thread; ``stop()`` ends it."""

    def __init__(self, app, port: int | None = None) -> None:
        # Bound here and handed to uvicorn: no window in which another process can take the port.
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port or 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    timeout_graceful_shutdown=2))
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except BaseException as exc:  # reported by start(), not lost in the thread
            self.error = exc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> ThreadedServer:
        self.thread.start()
        if wait:
            deadline = time.monotonic() + 30
            while not self.server.started:
                if time.monotonic() > deadline or not self.thread.is_alive():
                    alive = self.thread.is_alive()
                    why = repr(self.error) if self.error else ("timeout" if alive else "thread ended")
                    raise RuntimeError(f"test server on port {self.port} did not start: {why}")
                time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
