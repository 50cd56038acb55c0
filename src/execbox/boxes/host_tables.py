"""Host-wide kernel tables that every box shares, raised where one tenant could fill them for all.

``fs.file-max`` counts every open file on the host. A box can hold files open without holding
descriptors (map a file, close the descriptor: the mapping keeps the file open), at ~400 bytes
of its own memory each, so three boxes at the default 512 MiB filled a 24 GiB host's table
(~2.4 million, the kernel's default of one file per 10 KiB of RAM) in 15 s: every other tenant's
box, new boxes and unprivileged host services then failed with ENFILE. systemd (v240 and later)
raises the table to its maximum at boot for the same reason; execbox does the same when it runs
as root and finds it lower, so the bound on a box's open files is its own memory cgroup, which
the kernel charges for each one.

``kernel.pty.max`` counts every pty on the host. Each box has at most ``devpts.PTYS_PER_BOX``
(its own devpts instance), but those instances are mounted from the host's mount namespace, and
such instances may also use the ``kernel.pty.reserve`` kept for the host's own logins: with the
default 4096, 64 boxes at their cap would leave host root without a pty. So a root service raises
it, when lower, to what every box uid of ``EXECBOX_JAIL_UID_RANGE`` (every live box holds one)
at its cap needs, plus the default 4096 for the host. Each pty's ``tty_struct`` is charged to the
box's memory cgroup.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("execbox.host")

FILE_MAX = "/proc/sys/fs/file-max"
PTY_MAX = "/proc/sys/kernel/pty/max"
PTY_MAX_KERNEL = 1 << 20
"""NR_UNIX98_PTY_MAX: the kernel refuses a higher kernel.pty.max."""
PTY_HOST_SHARE = 4096
"""What the host keeps beside the boxes' ptys (the kernel's default kernel.pty.max)."""
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


def _raise(path: str, name: str, target: int, why: str) -> tuple[int | None, int | None]:
    """``path`` up to ``target`` when this process is root and finds it lower; (before, after).

    A host where it cannot be written (a read-only /proc/sys in a container) keeps its value,
    with a warning naming the command that raises it; ``execbox doctor`` reports it too."""
    before = _read_int(path)
    if before is None or before >= target or os.geteuid() != 0:
        return before, before
    try:
        with open(path, "w", encoding="ascii") as f:
            f.write(str(target))
    except OSError as e:
        log.warning("%s is %d and could not be raised (%s): one tenant's boxes can fill it for all; run "
                    "`sysctl -w %s=%d` on the host", name, before, e, name, target)
        return before, before
    after = _read_int(path)
    log.info("raised %s from %d to %s: %s", name, before, after, why)
    return before, after


def raise_file_max(path: str = FILE_MAX) -> tuple[int | None, int | None]:
    """fs.file-max up to its ceiling (LONG_MAX, as systemd does at boot)."""
    return _raise(path, "fs.file-max", FILE_MAX_TARGET, "as systemd does at boot, a box's open files are bounded "
                  "by its memory cgroup instead of a table every box on the host shares")


def pty_max_target(uid_count: int) -> int:
    """Every box at its pty cap, plus the host's own share; at most the kernel's ceiling."""
    from .devpts import PTYS_PER_BOX

    return min(PTY_MAX_KERNEL, uid_count * PTYS_PER_BOX + PTY_HOST_SHARE)


def raise_pty_max(uid_count: int, path: str = PTY_MAX) -> tuple[int | None, int | None]:
    """kernel.pty.max up to ``pty_max_target`` (boxes at their cap never reach the host's reserve)."""
    return _raise(path, "kernel.pty.max", pty_max_target(uid_count), "every box at its pty cap still leaves "
                  "the host's reserve and its own share")


def raise_once() -> None:
    """The raises above, on the first box provider's start in this process; only where boxes
    have memory cgroups (the bound these tables give way to)."""
    global _done
    with _lock:
        if _done:
            return
        _done = True
        raise_file_max()
        if os.geteuid() == 0:
            from .uids import configured_range

            try:
                raise_pty_max(configured_range().count)
            except Exception as e:  # noqa: BLE001 - a bad range is reported where boxes lease uids (SB002)
                log.warning("kernel.pty.max not raised: %s", e)


def pty_max_check(uid_count: int, path: str = PTY_MAX) -> dict[str, object]:
    """For `execbox doctor`: ok when every box uid at its pty cap leaves the host its share."""
    value, target = _read_int(path), pty_max_target(uid_count)
    if value is None:
        return {"ok": False, "detail": f"cannot read {path}"}
    if value >= target:
        return {"ok": True, "detail": f"kernel.pty.max {value}: {uid_count} boxes at their cap leave the host its ptys"}
    return {"ok": False, "detail": f"kernel.pty.max {value} is below {target} ({uid_count} box uids at their pty "
                                   f"cap plus the host's share): boxes can take the ptys the host keeps for its "
                                   f"logins; execbox raises it when it starts as root, or run "
                                   f"`sysctl -w kernel.pty.max={target}`"}


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
