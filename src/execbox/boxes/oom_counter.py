"""One cgroup's OOM-kill counter (v1 ``memory.oom_control``, v2 ``memory.events``), kept open.

Every session run reads it twice, before and after, to tell an out-of-memory kill (SB006) from
other deaths. Opening, reading and closing the file each time cost six syscalls per run, and each
let another of the service's threads take the GIL: with sixteen sessions running at once that
doubled the service's CPU per run (docs/benchmarks.md, "16-core scaling"). So the file stays open
and each read is one pread. A removed cgroup's file answers ENODEV, which reads as unreadable,
like a file that was never there.
"""

from __future__ import annotations

import os
import threading

_CLOSED = -2


def parse_oom_kills(text: str) -> int | None:
    """The ``oom_kill N`` line's N, or None when the file has no such line (old v1 kernels)."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return None


class OomCounter:
    """The counter file of one cgroup; ``close()`` once the cgroup is gone or no longer read."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1  # opened on first read; _CLOSED after close()
        self._lock = threading.Lock()  # never a pread on a descriptor close() freed and another reused

    def read_text(self) -> str | None:
        """The file's contents now, or None when it cannot be read (absent, removed, closed)."""
        with self._lock:
            if self._fd == _CLOSED:
                return None
            if self._fd < 0:
                try:
                    self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    return None
            try:
                return os.pread(self._fd, 4096, 0).decode("ascii")
            except OSError:
                return None

    def read(self) -> int | None:
        """The oom_kill count, or None when unreadable or not reported."""
        text = self.read_text()
        return None if text is None else parse_oom_kills(text)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
            self._fd = _CLOSED
