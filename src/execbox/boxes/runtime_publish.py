"""Publishing a finished runtime template build as ``v<N>`` (runtime_build.publish).

Version numbers are unique for a name's whole lifetime: the highest one given out is kept in
``<runtimes dir>/.seq/<name>``, which ``execbox runtime rm NAME`` leaves in place. So after
``rm NAME`` the next build is ``v<last + 1>``, never ``v1`` again: a pin ``NAME@vN`` (a session
registry row, a config) and the Docker image ``execbox/runtime-NAME:vN`` never come to mean other
content. Publishing is all or nothing: the link that becomes ``current`` is made first, and when
any step fails (a full disk) the build is renamed back and the caller gets SB002 saying nothing was
published; the previous version stays current.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import tempfile
from collections.abc import Callable, Iterator

from . import runtime as rt
from .runtime import RuntimeNotUsable

log = logging.getLogger(__name__)
SEQ = ".seq"
"""Directory next to the templates holding each name's highest version number ever published."""


def publish(top: str, work: str) -> str:
    """Rename the finished build ``work`` to the next ``v<N>`` of template dir ``top`` and point
    ``current`` at it; the version. SB002 when it cannot (``work`` is then still there)."""
    name = os.path.basename(top)
    tmp_link = os.path.join(top, f".current-{os.getpid()}")
    with _numbering(os.path.dirname(top), name) as (last, remember):
        in_place = [int(v[1:]) for v in os.listdir(top) if rt.is_version(v)]
        number = max([last, *in_place]) + 1
        version = f"v{number}"
        dest = os.path.join(top, version)
        renamed = False
        try:
            if os.path.lexists(tmp_link):
                os.unlink(tmp_link)
            os.symlink(version, tmp_link)  # before the rename: no new inode is needed after it
            remember(number)
            os.rename(work, dest)
            renamed = True
            os.replace(tmp_link, os.path.join(top, rt.CURRENT))
        except OSError as e:
            if renamed:
                _undo(dest, work)
            with contextlib.suppress(OSError):
                os.unlink(tmp_link)
            raise _not_published(name, e) from None
    return version


@contextlib.contextmanager
def _numbering(runtimes: str, name: str) -> Iterator[tuple[int, Callable[[int], None]]]:
    """(highest number given out for ``name``, a function recording a new one), under a lock that
    serialises every publish on this host (they are quick)."""
    seq = os.path.join(runtimes, SEQ)
    try:
        os.makedirs(seq, mode=0o755, exist_ok=True)
        lock = os.open(seq, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise _not_published(name, e) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = os.path.join(seq, name)
        try:
            with open(path, encoding="ascii") as f:
                last = int(f.read().strip() or 0)
        except (OSError, ValueError):  # never published (or unreadable: the dirs still count)
            last = 0

        def remember(number: int) -> None:
            fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=seq)
            try:
                with os.fdopen(fd, "w", encoding="ascii") as f:
                    f.write(f"{number}\n")
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

        yield last, remember
    finally:
        os.close(lock)


def _undo(dest: str, work: str) -> None:
    try:
        os.rename(dest, work)
    except OSError as e:  # nothing points at it: `current` was not swapped
        log.error("runtime publish: could not move %s back to %s: %s", dest, work, e)


def _not_published(name: str, e: OSError) -> RuntimeNotUsable:
    why = "the jail directory's disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else e.strerror or str(e)
    return RuntimeNotUsable(f"runtime {name}: publishing the build failed ({why}); nothing was published and "
                            "the current version is unchanged", details={"field": "name", "value": name,
                                                                        "errno": e.errno})
