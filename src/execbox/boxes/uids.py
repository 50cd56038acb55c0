"""Host uids for jail and Docker boxes: every concurrently running box gets its own uid/gid from a range.

Why: a box's user namespace is owned by the host uid its bwrap runs as, and the kernel grants a
process every capability inside any user namespace its euid owns, and lets it signal, trace and
read ``/proc`` of any process with the same uid. With one shared host uid, a process that
escaped box A (or any host process running as that uid) could signal, ptrace and read box B.
With one uid per box it is just another unprivileged user to B.

The model (see docs/jail.md):

* the range is ``EXECBOX_JAIL_UID_RANGE=FIRST:COUNT`` (default ``61000:4096``; the legacy
  ``EXECBOX_JAIL_HOST_UID`` still sets FIRST); uid and gid are the same number and need no
  passwd entry, but the range must not hold real users (``execbox doctor`` checks);
* a uid is leased by taking an exclusive ``flock`` on ``<jail dir>/uids/<uid>.lock``: the kernel
  drops the lock when the holder closes it or dies, so leases are shared correctly by every
  execbox process on the host (several services, test workers) and never leak across a crash;
* a lease is released only after the box's cgroup is empty: a process that survived the kill
  keeps its uid out of circulation instead of handing it to the next box;
* a box that can outlive its execbox process (a Docker container left running across a
  restart, or by a crash) also *pins* its uid: ``<uid>.pin`` beside the lock, which
  ``acquire`` skips even when no process holds the flock; its owner removes the pin once the
  box is gone (boxes/docker_uid.py);
* only when execbox runs as root (an unprivileged service cannot switch uids; its boxes run as
  the service's own uid, which the docs state).
"""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
import random
import threading
from dataclasses import dataclass

from ..errors import InvalidConfigError, RateLimitError
from .runtime import jail_dir

DEFAULT_FIRST = 61000
DEFAULT_COUNT = 4096
MAX_UID = 2**32 - 2  # (uid_t)-1 means "unchanged" to the set*id calls


@dataclass(frozen=True)
class UidRange:
    first: int
    count: int

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid <= self.last

    def describe(self) -> str:
        return f"{self.first}-{self.last} ({self.count} uids)"


def _bad(field: str, raw: str, why: str) -> InvalidConfigError:
    return InvalidConfigError(f"{field}: {raw!r} {why}", details={"field": field, "value": raw})


def configured_range() -> UidRange:
    """The host uid range from the environment; anything malformed is SB002."""
    raw = os.environ.get("EXECBOX_JAIL_UID_RANGE", "").strip()
    if raw:
        first_s, sep, count_s = raw.partition(":")
        if not sep or not first_s.strip().isdigit() or not count_s.strip().isdigit():
            raise _bad("EXECBOX_JAIL_UID_RANGE", raw, "is not FIRST:COUNT (e.g. 61000:4096)")
        first, count = int(first_s), int(count_s)
        if first == 0 or count == 0 or first + count - 1 > MAX_UID:
            raise _bad("EXECBOX_JAIL_UID_RANGE", raw, "must be non-zero uids below 2^32-1 and COUNT >= 1")
        return UidRange(first, count)
    legacy = os.environ.get("EXECBOX_JAIL_HOST_UID", "").strip()
    if not legacy:
        return UidRange(DEFAULT_FIRST, DEFAULT_COUNT)
    if not legacy.isdigit() or int(legacy) == 0 or int(legacy) > MAX_UID:
        raise _bad("EXECBOX_JAIL_HOST_UID", legacy, "is not a non-zero uid")
    first = int(legacy)
    return UidRange(first, min(DEFAULT_COUNT, MAX_UID - first + 1))


def users_in_range(rng: UidRange, limit: int = 5) -> list[str]:
    """Names of real passwd users inside the range (they would share a uid with boxes)."""
    found = []
    for entry in pwd.getpwall():
        if entry.pw_uid in rng:
            found.append(f"{entry.pw_name}({entry.pw_uid})")
            if len(found) >= limit:
                break
    return found


class UidLease:
    """One box's host uid, held until ``release()`` (or until this process dies)."""

    def __init__(self, uid: int, fd: int) -> None:
        self.uid = uid
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor drops the flock


_lock = threading.Lock()
_cursor: int | None = None


def lock_dir() -> str:
    return os.path.join(jail_dir(), "uids")


def acquire(rng: UidRange | None = None) -> UidLease:
    """Lease a uid no other running box (of any execbox process on this host) holds.

    Starts at a per-process random offset and moves on, so concurrent processes rarely probe
    the same lock files. Raises SB008 when every uid of the range is in use.
    """
    global _cursor
    rng = rng or configured_range()
    d = lock_dir()
    os.makedirs(d, mode=0o700, exist_ok=True)
    with _lock:
        if _cursor is None:
            _cursor = random.randrange(rng.count)  # noqa: S311 - spreading probes, not a secret
        start = _cursor
        for i in range(rng.count):
            offset = (start + i) % rng.count
            uid = rng.first + offset
            fd = _lock_uid(d, uid)
            if fd is None:
                continue
            if os.path.exists(_pin_path(d, uid)):  # a box that outlived its process still runs as it
                os.close(fd)
                continue
            _cursor = (offset + 1) % rng.count
            return UidLease(uid, fd)
    raise RateLimitError(f"all {rng.count} box uids ({rng.describe()}) are in use (jail and docker); destroy boxes or "
                         "widen EXECBOX_JAIL_UID_RANGE",
                         details={"field": "EXECBOX_JAIL_UID_RANGE", "range": rng.describe()})


def _pin_path(d: str, uid: int) -> str:
    return os.path.join(d, f"{uid}.pin")


def _lock_uid(d: str, uid: int) -> int | None:
    """The uid's lock file, flocked by us; None while another holder has it."""
    fd = os.open(os.path.join(d, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    return fd


def try_acquire(uid: int) -> UidLease | None:
    """Lease this very uid (pinned or not); None while a live process holds it.

    For a box that outlived the process that leased its uid: the next process takes the lease
    over from the pin it left."""
    d = lock_dir()
    os.makedirs(d, mode=0o700, exist_ok=True)
    fd = _lock_uid(d, uid)
    return None if fd is None else UidLease(uid, fd)


def pin(lease: UidLease, note: str = "") -> None:
    """Keep ``lease.uid`` out of ``acquire`` after this process lets go of it, until ``unpin``."""
    if not lease.held:
        raise RuntimeError(f"uid {lease.uid}: only a held lease can be pinned")
    path = _pin_path(lock_dir(), lease.uid)
    with open(path, "w", encoding="utf-8") as f:
        f.write(note)


def unpin(lease: UidLease) -> None:
    """Drop the pin of a lease this process holds (its box is gone)."""
    if not lease.held:
        raise RuntimeError(f"uid {lease.uid}: only a held lease can be unpinned")
    try:
        os.unlink(_pin_path(lock_dir(), lease.uid))
    except FileNotFoundError:
        pass


def pinned() -> list[int]:
    """Uids that carry a pin, held or not."""
    try:
        names = os.listdir(lock_dir())
    except FileNotFoundError:
        return []
    return sorted(int(n[:-4]) for n in names if n.endswith(".pin") and n[:-4].isdigit())
