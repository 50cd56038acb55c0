"""Output of background processes: a relay child writes it into segment files the agent reads.

A background process's stdout and stderr are pipes read by a small relay (a forked child of the
agent, the sandbox user, like ``pty_relay``), never files the process writes itself: the box's
file-size limit (RLIMIT_FSIZE, 512 MiB on the jail) counts every byte ever written to a file,
hole-punched or not, so a long-running server or log tailer writing to a file of its own died
with EFBIG after that much output in total, even when all of it had been read. The relay is not
under that limit; it writes each stream into segments of ``SEGMENT`` bytes
(``PREFIX.0``, ``PREFIX.1``, ...): byte ``n`` of the stream is byte ``n % SEGMENT`` of segment
``n // SEGMENT``, so offsets stay plain stream offsets and the agent needs no message from the
relay. The agent deletes a segment once the host has read past it and punches out what was read
in the current one (the files live on the box's tmpfs). The relay never blocks the process: it
drains the pipes as they fill (the agent's pause at a large backlog is what stops a writer).

The relay ends when both pipes reach EOF, or when the agent closes its control pipe (the
process's main pid exited): it then takes what the pipes already hold and exits, so output
written before the exit is in the files once the relay is reaped. Stdlib only.
"""

from __future__ import annotations

import gc
import os
import select
import time

SEGMENT = 32 * 1024 * 1024
"""Bytes per output segment file (every segment but the last is exactly this long)."""
READ = 64 * 1024
DRAIN_SECONDS = 1.0
"""At the end: at most this long draining pipes that something left running keeps filling."""
RETRY = 0.1
"""Seconds between tries of a write the tmpfs refused (full): the pipe then holds the writer."""


def segment_path(prefix: str, k: int) -> str:
    return f"{prefix}.{k}"


class _Segments:
    """The relay's writer of one stream."""

    def __init__(self, prefix: str, seg: int) -> None:
        self.prefix, self.seg = prefix, seg
        self.k, self.pos = 0, 0
        self.fd = os.open(segment_path(prefix, 0), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def write(self, data: bytes, give_up: float | None) -> None:
        view = memoryview(data)
        while view:
            if self.pos >= self.seg:  # this segment is full: the next one
                os.close(self.fd)
                self.k, self.pos = self.k + 1, 0
                self.fd = os.open(segment_path(self.prefix, self.k),
                                  os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
            try:
                n = os.write(self.fd, view[:self.seg - self.pos])
            except OSError:  # ENOSPC: a full tmpfs; wait for room (the agent frees what is read)
                if give_up is not None and time.monotonic() > give_up:
                    return
                time.sleep(RETRY)
                continue
            self.pos += n
            view = view[n:]


def relay_main(streams: dict[int, str], ctl_r: int, seg: int = SEGMENT) -> None:
    """Body of the relay child: copy each pipe (fd -> path prefix) into its segments; never returns."""
    gc.disable()  # no cycles here; a collection would copy the forked agent's pages
    try:
        relay(streams, ctl_r, seg)
    finally:
        os._exit(0)


def relay(streams: dict[int, str], ctl_r: int, seg: int = SEGMENT) -> None:
    """Copy until both pipes end, or until ``ctl_r`` ends (then drain what the pipes hold)."""
    writers = {fd: _Segments(prefix, seg) for fd, prefix in streams.items()}
    watched = [*writers, ctl_r]
    give_up: float | None = None
    while any(fd in writers for fd in watched):
        if give_up is not None and time.monotonic() > give_up:
            break
        try:
            readable = select.select(watched, [], [], None if give_up is None else 0)[0]
        except InterruptedError:
            continue
        if give_up is not None and not readable:
            break  # the pipes are empty: everything written before the end is in the files
        if ctl_r in readable:
            try:
                os.read(ctl_r, 64)
            except OSError:
                pass
            watched.remove(ctl_r)
            give_up = time.monotonic() + DRAIN_SECONDS
            continue
        for fd in readable:
            try:
                data = os.read(fd, READ)
            except OSError:
                data = b""
            if not data:
                watched.remove(fd)
                continue
            writers[fd].write(data, give_up)


# -- the agent's side --------------------------------------------------------------------------


def read_from(prefix: str, offset: int, limit: int, seg: int) -> tuple[bytes, bool, int]:
    """Up to ``limit`` bytes of the stream from ``offset``; True when more is already there; the
    stream's size. ``seg`` 0: one file (``PREFIX.0``), written by a PTY relay."""
    k, inner = divmod(offset, seg) if seg else (0, offset)
    try:
        with open(segment_path(prefix, k), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(inner)
            data = f.read(limit)
    except OSError:
        return b"", False, offset
    if not seg:
        return data, inner + len(data) < size, size
    last, last_size = k, size
    while os.path.exists(segment_path(prefix, last + 1)):
        last += 1
        try:
            last_size = os.path.getsize(segment_path(prefix, last))
        except OSError:
            last_size = 0
    total = last * seg + last_size
    return data, offset + len(data) < total, total


def free_read(prefix: str, done: int, upto: int, seg: int) -> int:
    """Free ``[done, upto)`` of the stream (read by the host): whole segments are deleted, the
    current one punched (page-aligned, its size kept); the new freed mark."""
    if seg:
        first, last = done // seg, upto // seg
        for k in range(first, last):
            try:
                os.unlink(segment_path(prefix, k))
            except OSError:
                pass
        if last > first:
            done = last * seg
    k, inner = divmod(upto, seg) if seg else (0, upto)
    punched = _punch(segment_path(prefix, k), inner)
    return max(done, k * seg + punched) if seg else max(done, punched)


def remove(prefix: str) -> None:
    """Delete every segment of a stream."""
    folder, base = os.path.split(prefix)
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if name.startswith(base + ".") and name[len(base) + 1:].isdigit():
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass


_FALLOC_PUNCH = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE


def _punch(path: str, upto: int) -> int:
    """Free ``[0, upto)`` of ``path`` (page-aligned) keeping its size; the new freed mark, or 0."""
    end = upto & ~4095
    if end <= 0:
        return 0
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            return end if libc.fallocate(fd, _FALLOC_PUNCH, 0, end) == 0 else 0
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        return 0
