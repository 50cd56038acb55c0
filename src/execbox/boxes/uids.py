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
* a uid is leased by taking an exclusive ``flock`` on ``/run/execbox/uids/<uid>.lock``
  (``HOST_LOCK_DIR``): the kernel drops the lock when the holder closes it or dies, so leases are
  shared correctly by every execbox process on the host (several services, test workers) and
  never leak across a crash. The directory is one fixed host-wide path because host uids are
  host-wide: under ``EXECBOX_JAIL_DIR``, two processes with different jail dirs handed the same
  uid to two tenants' boxes. ``/run`` is a tmpfs (systemd hosts): leases and pins go with a
  reboot, as every box's processes do (execbox never restarts a stopped container). A symlink, a
  non-directory, or one not owned by root or writable by group or others there (or as
  ``/run/execbox``) is refused (SB002), never followed;
* a lease is released only after the box's cgroup is empty: a process that survived the kill
  keeps its uid out of circulation instead of handing it to the next box;
* a box that can outlive its execbox process (a Docker container left running across a
  restart, or by a crash) also *pins* its uid: ``<uid>.pin`` beside the lock, which
  ``acquire`` skips even when no process holds the flock; its owner removes the pin once the
  box is gone (boxes/docker_uid.py);
* leases and pins of an execbox from before that move, in ``<jail dir>/uids``, still count: a uid
  whose old lock a live process holds, or that carries an old pin (a Docker box that outlived
  the upgraded process), is skipped, and a lease also holds the old lock where one exists, so
  an old process that shares this jail dir skips it too;
* only when execbox runs as root (an unprivileged service cannot switch uids; its boxes run as
  the service's own uid, which the docs state). Without root nothing is leased for real (only
  tests do) and the locks stay in ``<jail dir>/uids``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
import random
import stat
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

    def __init__(self, uid: int, fd: int, legacy_fd: int | None = None) -> None:
        self.uid = uid
        self._fd: int | None = fd
        self._legacy_fd = legacy_fd  # the lock in the pre-upgrade dir, where one exists

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        legacy_fd, self._legacy_fd = self._legacy_fd, None
        for f in (legacy_fd, fd):
            if f is not None:
                os.close(f)  # closing the only descriptor drops the flock


_lock = threading.Lock()
_cursor: int | None = None

HOST_LOCK_DIR = "/run/execbox/uids"  # host uids are host-wide, so are their leases (tests point it elsewhere)


def _host_wide() -> bool:
    """Boxes get leased host uids only as root; then leases live in ``HOST_LOCK_DIR``."""
    return os.geteuid() == 0


def _refused(path: str, why: str) -> InvalidConfigError:
    return InvalidConfigError(f"box uid lease directory {path} {why}; refusing to use it (remove it: execbox "
                              "recreates it, root-owned, mode 0700)", details={"path": path})


def _checked_dir(parent_fd: int | None, path: str, mode: int) -> int:
    """``path`` opened as a directory (created with ``mode`` if missing), relative to ``parent_fd``
    when given: never through a symlink, and only if root (this process) owns it and no one
    else may write to it. Returns its descriptor."""
    name = os.path.basename(path) if parent_fd is not None else path
    try:
        os.mkdir(name, mode, dir_fd=parent_fd)
    except FileExistsError:
        pass
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            what = "is a symlink" if os.path.islink(path) else "is not a directory"
            raise _refused(path, what) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        why = (f"is owned by uid {st.st_uid}, not root" if st.st_uid != os.geteuid()
               else f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})")
        raise _refused(path, why)
    return fd


def lock_dir() -> str:
    """The directory of uid locks and pins: ``HOST_LOCK_DIR`` as root, checked (and created) on
    every call; ``<jail dir>/uids`` otherwise (as before: nothing is leased for real there)."""
    if not _host_wide():
        return os.path.join(jail_dir(), "uids")
    parent = _checked_dir(None, os.path.dirname(HOST_LOCK_DIR), 0o755)
    try:
        os.close(_checked_dir(parent, HOST_LOCK_DIR, 0o700))
    finally:
        os.close(parent)
    return HOST_LOCK_DIR


def _legacy_dir() -> str | None:
    """``<jail dir>/uids``, where a root execbox from before ``HOST_LOCK_DIR`` kept its leases and
    pins, if there is one (None without root, or when it is ``HOST_LOCK_DIR`` itself, also through
    a link or a bind: locking one file twice would make every uid look taken). Never created."""
    if not _host_wide():
        return None
    d = os.path.join(jail_dir(), "uids")
    try:
        if not os.path.isdir(d) or os.path.samefile(d, HOST_LOCK_DIR):
            return None
    except OSError:  # HOST_LOCK_DIR missing: lock_dir() makes it before any lease
        return None
    return d


def _dirs(d: str | None = None) -> list[str]:
    """Every directory whose pins count: the lease directory ``d``, then the pre-upgrade one."""
    return [d or lock_dir(), *filter(None, [_legacy_dir()])]


def acquire(rng: UidRange | None = None) -> UidLease:
    """Lease a uid no other running box (of any execbox process on this host) holds.

    Starts at a per-process random offset and moves on, so concurrent processes rarely probe
    the same lock files. Raises SB008 when every uid of the range is in use.
    """
    global _cursor
    rng = rng or configured_range()
    dirs = _dirs(_ready_dir())
    with _lock:
        if _cursor is None:
            _cursor = random.randrange(rng.count)  # noqa: S311 - spreading probes, not a secret
        start = _cursor
        for i in range(rng.count):
            offset = (start + i) % rng.count
            uid = rng.first + offset
            lease = _take(dirs, uid)
            if lease is None:
                continue
            if any(os.path.lexists(_pin_path(d, uid)) for d in dirs):  # an outlived box still runs as it
                lease.release()
                continue
            _cursor = (offset + 1) % rng.count
            return lease
    raise RateLimitError(f"all {rng.count} box uids ({rng.describe()}) are in use (jail and docker); destroy boxes or "
                         "widen EXECBOX_JAIL_UID_RANGE",
                         details={"field": "EXECBOX_JAIL_UID_RANGE", "range": rng.describe()})


def _ready_dir() -> str:
    d = lock_dir()
    if not _host_wide():
        os.makedirs(d, mode=0o700, exist_ok=True)
    return d


def _pin_path(d: str, uid: int) -> str:
    return os.path.join(d, f"{uid}.pin")


def _take(dirs: list[str], uid: int) -> UidLease | None:
    """The uid's lock in ``dirs[0]`` and, where a pre-upgrade execbox's directory ``dirs[1]``
    exists, that one's lock too (made if missing, as the old process would make it: so it sees
    the uid taken); None while a live process holds either."""
    fd = _lock_uid(dirs[0], uid)
    if fd is None:
        return None
    legacy_fd = None
    for old in dirs[1:]:
        try:
            legacy_fd = _lock_uid(old, uid)
        except (FileNotFoundError, NotADirectoryError):
            pass  # the old directory went meanwhile
        except BaseException:
            os.close(fd)
            raise
        else:
            if legacy_fd is None:  # an old execbox process still runs a box as this uid
                os.close(fd)
                return None
    return UidLease(uid, fd, legacy_fd)


def _lock_uid(d: str, uid: int) -> int | None:
    """The uid's lock file, flocked by us; None while another holder has it."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_CREAT
    fd = os.open(os.path.join(d, f"{uid}.lock"), flags, 0o600)
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
    return _take(_dirs(_ready_dir()), uid)


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
    for d in _dirs():  # and a pin an execbox from before HOST_LOCK_DIR left
        try:
            os.unlink(_pin_path(d, lease.uid))
        except FileNotFoundError:
            pass


def pinned() -> list[int]:
    """Uids that carry a pin, held or not (in either directory)."""
    found: set[int] = set()
    for d in _dirs():
        try:
            names = os.listdir(d)
        except (FileNotFoundError, NotADirectoryError):
            continue
        found.update(int(n[:-4]) for n in names if n.endswith(".pin") and n[:-4].isdigit())
    return sorted(found)


def pin_note(uid: int) -> str | None:
    """What ``pin`` wrote for ``uid`` (None when it carries no pin)."""
    for d in _dirs():
        try:
            with open(_pin_path(d, uid), encoding="utf-8") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            continue
    return None
