"""A box's own devpts instance with a cap on its ptys (root only).

Every devpts instance counts against one host-wide counter, ``kernel.pty.max`` (less
``kernel.pty.reserve``, kept for the host's initial instance). bwrap's ``--dev /dev`` mounts a new
instance with no cap of its own, so code in one box could open every pty the host has left, and
then no other tenant's box (``os.openpty``, ``pty.create``) could get one until that box went.

As root the service mounts an instance with ``max=PTYS_PER_BOX`` on ``<box dir>/pty/pts`` and bwrap
binds it over the box's ``/dev/pts`` (``--dev-bind`` after ``--dev /dev``: bwrap's own instance
stays below it, unused; ``/dev/ptmx`` is bwrap's link to ``pts/ptmx``). Its other options are
bwrap's (``ptmxmode=0666,mode=620``, nosuid, noexec, no ``gid=``), so a slave belongs to the box
user that opened it, as before. One mount(2) on start and one umount2(2) on teardown, no process.
Without root bwrap's own instance is used, as before (the host-wide limit is then the only one).

A Docker box under runc (boxes/docker_host.py) gets the same: runc's own devpts instance has no
cap either, so the service mounts one on ``<host dir>/pty/pts`` and the container binds it over its
``/dev/pts`` (Docker then drops its default devpts; runc's ``/dev/ptmx`` is its link to
``pts/ptmx``). gVisor (runsc) keeps its own devpts inside the sentry and gets none.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os

log = logging.getLogger("execbox.boxes.devpts")

PTYS_PER_BOX = 64
"""Most ptys open at once in one box (E2B ``pty.create`` terminals, ``script``, ``pty.fork``...).
The host's ``kernel.pty.max`` (4096 by default, 1024 of them reserved for the host) bounds all
boxes together; past this cap opening ``/dev/ptmx`` in the box fails with ENOSPC."""

GATE = "pty"  # <box dir>/pty: 0700, the box's host uid (see mount)
DIRNAME = "pts"  # <box dir>/pty/pts: the mount point
OPTIONS = f"newinstance,ptmxmode=0666,mode=620,max={PTYS_PER_BOX}"
MS_NOSUID, MS_NOEXEC = 2, 8
MNT_DETACH, UMOUNT_NOFOLLOW = 2, 8

_libc: ctypes.CDLL | None = None
_refused = False  # root that may not mount (no CAP_SYS_ADMIN): the runtime's own instance from then on


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        _libc = libc
    return _libc


def path(box_dir: str) -> str:
    return os.path.join(box_dir, GATE, DIRNAME)


def mount(box_dir: str, owner_uid: int | None = None) -> str | None:
    """Mount a capped instance on ``<box_dir>/pty/pts`` (made here; ``box_dir`` is the box's fresh,
    root-owned directory) and return that path for ``--dev-bind`` (or a Docker bind on /dev/pts).
    ``pty`` is mode 0700, owned by ``owner_uid`` (the box's host uid, as which bwrap binds it; root
    otherwise): the instance's ``ptmx`` is 0666, and any host account that could reach it could
    open the box's 64 ptys. None when this process is not root, or is a root that may not mount
    (logged once): the box then gets its runtime's own instance (bwrap's, runc's)."""
    global _refused
    if os.geteuid() != 0 or _refused:
        return None
    gate = os.path.join(box_dir, GATE)
    os.mkdir(gate, 0o700)  # never an existing entry (mkdir does not follow a link there)
    if owner_uid is not None:
        os.chown(gate, owner_uid, owner_uid, follow_symlinks=False)
    target = path(box_dir)
    os.mkdir(target, 0o755)
    if _c().mount(b"devpts", target.encode(), b"devpts", MS_NOSUID | MS_NOEXEC, OPTIONS.encode()) == 0:
        return target
    err = ctypes.get_errno()
    os.rmdir(target)
    os.rmdir(gate)
    if err in (errno.EPERM, errno.EACCES):
        _refused = True
        log.warning("cannot mount a devpts instance (%s): boxes get their runtime's own (bwrap's, runc's), "
                    "without a per-box pty cap", os.strerror(err))
        return None
    raise OSError(err, f"mounting the box's devpts failed: {os.strerror(err)}")


def unmount(box_dir: str) -> bool:
    """Detach whatever is mounted on ``<box_dir>/pts`` (lazily; a symlink there is never followed).
    True when nothing is mounted there now (also when nothing was). Not root: nothing to do (only
    root mounts one, and only root could unmount it)."""
    if os.geteuid() != 0:
        return True
    if _c().umount2(path(box_dir).encode(), MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT, errno.ENOTDIR):  # not a mount point, or not there
            log.error("cannot unmount the devpts of %s: %s", os.path.basename(box_dir), os.strerror(err))
            return False
    for d in (path(box_dir), os.path.join(box_dir, GATE)):  # empty now: the box dir's removal is one level
        try:
            os.rmdir(d)
        except OSError:
            pass
    return True
