"""One thread that drains the stderr of every jail box and keeps only its last few KB.

A box's stderr (bwrap's and the agent's own, never user code's, which the agent captures) must
not go to a host file: code in the box can reopen it through /proc/<pid>/fd/2 and fill the
host disk. A pipe read here is bounded memory, never blocks the box, and keeps the tail for
error messages (why a box failed to start, why it died).
"""

from __future__ import annotations

import os
import selectors
import threading
from collections import deque

TAIL_BYTES = 4096


class Tail:
    def __init__(self) -> None:
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.closed = threading.Event()

    def add(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        while self.size > TAIL_BYTES and len(self.chunks) > 1:
            self.size -= len(self.chunks.popleft())

    def text(self, limit: int = 400) -> str:
        return b"".join(self.chunks)[-limit:].decode("utf-8", "replace").strip()


class StderrSink:
    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread: threading.Thread | None = None

    def watch(self, fd: int) -> Tail:
        """Own ``fd`` (a pipe's read end): drain it until EOF, then close it."""
        tail = Tail()
        os.set_blocking(fd, False)
        with self._lock:
            self._sel.register(fd, selectors.EVENT_READ, tail)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="execbox-jail-stderr", daemon=True)
                self._thread.start()
        os.write(self._wake_w, b"x")
        return tail

    def _run(self) -> None:
        while True:
            for key, _ in self._sel.select():
                if key.data is None:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                    continue
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    key.data.add(data)
                    continue
                with self._lock:
                    self._sel.unregister(key.fd)
                os.close(key.fd)
                key.data.closed.set()


sink = StderrSink()
