"""Leases on staged directories (the box's /etc copies, the agent copies), so old ones can go.

A staged directory is bound read-only into boxes, and a new one appears on every host change
(bwrap.staged_etc) or upgrade (staging.staged_agent). Removing one under a running box would
empty that box's /etc or agent. Jail boxes die with the execbox process that started them, so
"in use" means "used by a live execbox process": each one takes a shared flock on the sibling
``<dir>.lease`` the first time it uses a directory and keeps it until it exits. ``sweep`` removes
a directory only when it can take that lease exclusively. Directories staged by versions before
leases existed have no lease file and are left alone (an old process may still run boxes on them).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

LEASE = ".lease"
TRASH = ".trash-"
STALE_TMP_AGE = 3600.0  # a staging still in progress is seconds old; a crashed one is left behind

_held: dict[str, int] = {}
_lock = threading.Lock()


def hold(path: str) -> None:
    """Lease ``path`` for the rest of this process (idempotent). Call before checking it exists:
    once held, no sweep removes it, so what the check finds stays."""
    path = os.path.abspath(path)
    with _lock:
        if path in _held:
            return
        lease = path + LEASE
        while True:
            # 0600: flock needs only read access, and a host user who could open it could
            # lock it exclusively and stall every box start here
            fd = os.open(lease, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a sweep is removing it
            if _same_file(fd, lease):
                _held[path] = fd
                return
            os.close(fd)  # a sweep removed the lease we opened: lease the new one


def held(path: str) -> bool:
    return os.path.abspath(path) in _held


def _same_file(fd: int, lease: str) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(lease).st_ino
    except FileNotFoundError:
        return False


def sweep(parent: str, is_tmp: Callable[[str], bool] = lambda name: False) -> list[str]:
    """Remove the leased directories in ``parent`` that no live process holds; returns them.

    Also removes what an interrupted sweep left (``*.trash-*``) and stagings abandoned by a crash
    (names for which ``is_tmp`` is true, older than an hour).
    """
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        path = os.path.join(parent, name)
        if name.endswith(LEASE):
            if _sweep_one(path[: -len(LEASE)]):
                removed.append(path[: -len(LEASE)])
        elif (TRASH in name and _owner_gone(name)) or (is_tmp(name) and _older_than(path, STALE_TMP_AGE)):
            _remove(path)
    return removed


def _sweep_one(path: str) -> bool:
    if held(path):
        return False
    lease = path + LEASE
    try:
        fd = os.open(lease, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live process uses it
        if not _same_file(fd, lease):
            return False  # another sweep got there first
        trash = f"{path}{TRASH}{os.getpid()}-{os.urandom(3).hex()}"
        if os.path.lexists(path):
            os.rename(path, trash)  # gone from its name at once
        os.unlink(lease)  # while still locked: a waiting hold() sees the inode change
    except OSError as e:
        log.warning("cannot remove the old staged directory %s: %s", path, e)
        return False
    finally:
        os.close(fd)
    _remove(trash)  # after the unlock, so a box start waiting in hold() is not held up by it
    return True


def _owner_gone(trash_name: str) -> bool:
    """Whether the sweep that made this ``*.trash-<pid>-*`` entry has ended (it may still be
    removing it)."""
    pid = trash_name.rsplit(TRASH, 1)[1].split("-")[0]
    return pid.isdigit() and not os.path.exists(f"/proc/{pid}")


def _older_than(path: str, age: float) -> bool:
    try:
        return time.time() - os.lstat(path).st_mtime > age
    except OSError:
        return False


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("cannot remove %s: %s", path, e)
