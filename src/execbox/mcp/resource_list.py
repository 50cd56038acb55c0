"""Which listed workspace entries ``resources/list`` offers: the files a ``resources/read`` can read.

Only regular files: not directories, FIFOs, sockets or devices (the listing's ``kind``, from lstat;
a read of any of them is refused). A workspace listing shows a symlink as itself (its own text,
never followed). Reading one follows it, and a read of a link that leads out of the workspace (an
absolute target, ``..`` past the root, or through another link that does) is refused, as is one
that leads to a directory, to something other than a regular file, or to nothing. So a symlink is
offered only when its chain of links, resolved by name against the same listing (as
``os.path.realpath`` resolves it for the read), ends at a regular file inside the workspace; it is
listed with that file's size. A link whose text the listing cannot carry (not valid UTF-8: kind
``symlink`` without a ``symlink_target``) is left out, and so is any chain through one.

The work is bounded, since a box's code makes the listing: ``iter_readable`` is a generator the
caller stops once it has enough, and a ``Steps`` budget, shared by every listing of one call,
counts the entries looked at and each path component a resolution walks; once it is spent the
rest of the listings are left out (chains of long link texts could otherwise hold the API
process's CPU for minutes).
"""

from __future__ import annotations

import posixpath
from collections import deque
from collections.abc import Iterable, Iterator

from ..models import FileInfo

MAX_HOPS = 40
"""Links followed in one resolution (Linux's own limit, ELOOP past it)."""
MAX_STEPS = 1_000_000
"""Entries looked at and path components walked in one ``resources/list`` call (~1 s at worst)."""


class Steps:
    """A work budget shared by the listings of one call: ``take(n)`` is False once it is spent."""

    __slots__ = ("left",)

    def __init__(self, limit: int = MAX_STEPS) -> None:
        self.left = limit

    def take(self, n: int = 1) -> bool:
        self.left -= n
        return self.left >= 0


def iter_readable(entries: Iterable[FileInfo], steps: Steps | None = None) -> Iterator[FileInfo]:
    """The regular files of a listing, and the symlinks that resolve inside it to one (with the
    file's size), in listing order, lazily; none more once ``steps`` is spent."""
    entries = list(entries)
    steps = steps if steps is not None else Steps()
    by_path = {e.path: e for e in entries}
    for e in entries:
        if not steps.take():
            return
        if e.is_dir:
            continue
        if not _is_link(e):
            if _is_regular(e):
                yield e
            continue
        target = _resolve(e.path, by_path, steps)
        if target is not None:
            yield FileInfo(e.path, target.size, False, e.modified, e.symlink_target, e.kind)
        elif steps.left < 0:
            return


def _is_link(e: FileInfo) -> bool:
    return e.symlink_target is not None or e.kind == "symlink"


def _is_regular(e: FileInfo) -> bool:
    """A regular file (a listing without ``kind``, from an older agent, says only ``is_dir``)."""
    return e.kind == "file" if e.kind is not None else not e.is_dir


def _resolve(path: str, by_path: dict[str, FileInfo], steps: Steps) -> FileInfo | None:
    """The regular file ``path`` leads to through the listing's symlinks; None when it leads
    outside the workspace, to a directory or other non-regular entry, to an entry the listing
    lacks, through a link whose text it lacks, loops, or ``steps`` runs out."""
    hops = 0
    pending = deque(path.split("/"))
    done: list[str] = []  # the resolved path so far, each entry the whole path to that level
    while pending:
        if not steps.take():
            return None
        part = pending.popleft()
        if part in ("", "."):
            continue
        if part == "..":
            if not done:
                return None  # above the workspace root
            done.pop()
            continue
        here = done[-1] + "/" + part if done else part
        entry = by_path.get(here)
        if entry is None:
            return None
        if not _is_link(entry):
            done.append(here)
            continue
        hops += 1
        target = entry.symlink_target
        if hops > MAX_HOPS or not target or posixpath.isabs(target):
            return None  # a loop, a link text the listing lacks, or an absolute target (outside)
        parts = target.split("/")
        if not steps.take(len(parts)):
            return None
        pending.extendleft(reversed(parts))
    entry = by_path.get(done[-1]) if done else None
    return entry if entry is not None and not entry.is_dir and not _is_link(entry) and _is_regular(entry) else None
