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
process's main pid exited): it then takes what the pipes already hold, reports how many bytes
of each stream it wrote on its report pipe and exits, so output written before the exit is in
the files once the relay is reaped. Those counts are the streams' final sizes: the agent never
reads past them (``read_from``'s ``final``), whatever later happens to the files.

The directory is not private from the box: user code runs as the same uid, so it can append to,
truncate, delete or replace a segment (with a FIFO or a symlink). The relay writes at its own
offsets (``pwrite``, not ``O_APPEND``: an append does not shift the real output), the relay is
non-dumpable (its pipes are out of reach through ``/proc``), and the agent opens segments with
``O_NOFOLLOW|O_NONBLOCK`` and reads only regular files, so a planted file never blocks it; what
user code writes into a segment can still show up in that stream, and what it deletes is lost.
Stdlib only.
"""

from __future__ import annotations

import gc
import os
import select
import stat
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
        self.fd = os.open(segment_path(prefix, 0), os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.total = 0  # bytes of the stream written so far

    def write(self, data: bytes, give_up: float | None) -> None:
        view = memoryview(data)
        while view:
            if self.pos >= self.seg:  # this segment is full: the next one
                os.close(self.fd)
                self.k, self.pos = self.k + 1, 0
                self.fd = os.open(segment_path(self.prefix, self.k),
                                  os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                n = os.pwrite(self.fd, view[:self.seg - self.pos], self.pos)
            except OSError:  # ENOSPC: a full tmpfs; wait for room (the agent frees what is read)
                if give_up is not None and time.monotonic() > give_up:
                    return
                time.sleep(RETRY)
                continue
            self.pos += n
            self.total += n
            view = view[n:]


def relay_main(streams: dict[int, str], ctl_r: int, report_w: int | None = None, seg: int = SEGMENT) -> None:
    """Body of the relay child: copy each pipe (fd -> path prefix) into its segments, then write
    the bytes written per stream (in ``streams``' order, ``"N N\\n"``) to ``report_w``; never returns."""
    gc.disable()  # no cycles here; a collection would copy the forked agent's pages
    try:
        totals = relay(streams, ctl_r, seg)
        if report_w is not None:
            os.write(report_w, (" ".join(map(str, totals)) + "\n").encode())
    finally:
        os._exit(0)


def relay(streams: dict[int, str], ctl_r: int, seg: int = SEGMENT) -> list[int]:
    """Copy until both pipes end, or until ``ctl_r`` ends (then drain what the pipes hold): the
    bytes written of each stream."""
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
    return [w.total for w in writers.values()]


def read_report(report_r: int) -> tuple[int, int] | None:
    """The relay's final counts (stdout, stderr) from its report pipe, or None (it was killed)."""
    try:
        os.set_blocking(report_r, False)
        raw = os.read(report_r, 128)
    except OSError:
        return None
    parts = raw.split()
    if not raw.endswith(b"\n") or len(parts) != 2 or not all(x.isdigit() for x in parts):
        return None
    return int(parts[0]), int(parts[1])


# -- the agent's side --------------------------------------------------------------------------


def _open_regular(path: str, flags: int) -> int | None:
    """An fd of ``path`` when it is a regular file (never following a symlink, never waiting on a
    FIFO user code put there), else None."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _regular_size(path: str) -> int | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def stream_size(prefix: str, offset: int, seg: int) -> int:
    """The stream's size as its files say now (from the segment holding ``offset`` on)."""
    if not seg:
        return max(offset, _regular_size(segment_path(prefix, 0)) or 0)
    k = offset // seg
    size = _regular_size(segment_path(prefix, k))
    if size is None:
        return offset
    while (more := _regular_size(segment_path(prefix, k + 1))) is not None:
        k, size = k + 1, more
    return max(offset, k * seg + size)


def read_from(prefix: str, offset: int, limit: int, seg: int,
              final: int | None = None) -> tuple[bytes, bool, int]:
    """Up to ``limit`` bytes of the stream from ``offset``; True when more is already there; the
    stream's size. ``seg`` 0: one file (``PREFIX.0``), written by a PTY relay. ``final``: the
    stream's final size (its writer is gone): nothing past it is read, whatever the files hold
    now, and a stream whose files fall short of it has no more (what is missing is lost)."""
    k, inner = divmod(offset, seg) if seg else (0, offset)
    if final is not None:
        limit = max(0, min(limit, final - offset))
    want = min(limit, seg - inner) if seg else limit
    data = b""
    fd = _open_regular(segment_path(prefix, k), os.O_RDONLY) if want > 0 or final is None else None
    if fd is not None:
        try:
            data = os.pread(fd, want, inner) if want > 0 else b""
        except OSError:
            data = b""
        finally:
            os.close(fd)
    elif final is None:
        return b"", False, offset
    if final is not None:
        return data, len(data) == want and offset + len(data) < final, max(final, offset)
    total = stream_size(prefix, offset, seg)
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
        fd = _open_regular(path, os.O_WRONLY)
        if fd is None:
            return 0
        try:
            return end if libc.fallocate(fd, _FALLOC_PUNCH, 0, end) == 0 else 0
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        return 0
