"""Host-wide kernel tables that every box shares, raised where one tenant could fill them for all.

``fs.file-max`` counts every open file on the host. A box can hold files open without holding
descriptors (map a file, close the descriptor: the mapping keeps the file open), at ~400 bytes
of its own memory each, so three boxes at the default 512 MiB filled a 24 GiB host's table
(~2.4 million, the kernel's default of one file per 10 KiB of RAM) in 15 s: every other tenant's
box, new boxes and unprivileged host services then failed with ENFILE. systemd (v240 and later)
raises the table to its maximum at boot for the same reason; execbox does the same when it runs
as root and finds it lower, so the bound on a box's open files is its own memory cgroup, which
the kernel charges for each one.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("execbox.host")

FILE_MAX = "/proc/sys/fs/file-max"
FILE_MAX_TARGET = 2**63 - 1
"""LONG_MAX, the kernel's own ceiling for fs.file-max and the value systemd writes."""

_lock = threading.Lock()
_done = False


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def raise_file_max(path: str = FILE_MAX) -> tuple[int | None, int | None]:
    """fs.file-max up to its maximum when this process is root and finds it lower; (before, after).

    A host where it cannot be written (a read-only /proc/sys in a container) keeps its value,
    with a warning naming the command that raises it; ``execbox doctor`` reports it too."""
    before = _read_int(path)
    if before is None or before >= FILE_MAX_TARGET or os.geteuid() != 0:
        return before, before
    try:
        with open(path, "w", encoding="ascii") as f:
            f.write(str(FILE_MAX_TARGET))
    except OSError as e:
        log.warning("fs.file-max is %d and could not be raised (%s): one tenant's boxes can fill the host's "
                    "open-file table; run `sysctl -w fs.file-max=%d` on the host", before, e, FILE_MAX_TARGET)
        return before, before
    after = _read_int(path)
    log.info("raised fs.file-max from %d to %s, as systemd does at boot: a box's open files are bounded by its "
             "memory cgroup instead of a table every box on the host shares", before, after)
    return before, after


def raise_file_max_once() -> None:
    """``raise_file_max`` on the first box provider's start in this process."""
    global _done
    with _lock:
        if not _done:
            _done = True
            raise_file_max()


def file_max_check(path: str = FILE_MAX, meminfo: str = "/proc/meminfo") -> dict[str, object]:
    """For `execbox doctor`: ok when all of the host's memory, spent on open files at ~256 bytes
    each, could not fill the table."""
    value = _read_int(path)
    mem_kb = None
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kb = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    if value is None:
        return {"ok": False, "detail": f"cannot read {path}"}
    needed = (mem_kb or 0) * 1024 // 256
    if value >= needed:
        return {"ok": True, "detail": f"fs.file-max {value}: boxes are bounded by their memory limits"}
    return {"ok": False, "detail": f"fs.file-max {value} is below what box memory can fill ({needed}): one tenant "
                                   f"can exhaust the host's open files; execbox raises it when it starts as root, "
                                   f"or run `sysctl -w fs.file-max={FILE_MAX_TARGET}`"}
