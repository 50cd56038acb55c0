"""Which listed workspace entries ``resources/list`` offers: the files a ``resources/read`` can read.

A workspace listing shows a symlink as itself (its own text, never followed). Reading one follows
it, and a read of a link that leads out of the workspace (an absolute target, ``..`` past the
root, or through another link that does) is refused, as is one that leads to a directory or to
nothing. So a symlink is offered only when its chain of links, resolved by name against the same
listing, ends at a regular file inside the workspace; it is listed with that file's size.
"""

from __future__ import annotations

import posixpath

from ..models import FileInfo

MAX_HOPS = 40
"""Links followed in one resolution (Linux's own limit, ELOOP past it)."""


def readable_files(entries: list[FileInfo]) -> list[FileInfo]:
    """The regular files of a listing, and the symlinks that resolve inside it to one (with the
    file's size), in listing order."""
    by_path = {e.path: e for e in entries}
    out: list[FileInfo] = []
    for e in entries:
        if e.is_dir:
            continue
        if e.symlink_target is None:
            out.append(e)
            continue
        target = _resolve(e.path, by_path)
        if target is not None:
            out.append(FileInfo(e.path, target.size, False, e.modified, e.symlink_target))
    return out


def _resolve(path: str, by_path: dict[str, FileInfo]) -> FileInfo | None:
    """The regular file ``path`` leads to through the listing's symlinks; None when it leads
    outside the workspace, to a directory, to an entry the listing lacks, or loops."""
    hops = 0
    pending = path.split("/")
    done: list[str] = []
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not done:
                return None  # above the workspace root
            done.pop()
            continue
        here = "/".join([*done, part])
        entry = by_path.get(here)
        if entry is None:
            return None
        if entry.symlink_target is None:
            done.append(part)
            continue
        hops += 1
        if hops > MAX_HOPS or not entry.symlink_target or posixpath.isabs(entry.symlink_target):
            return None  # a loop, an unreadable link text, or an absolute target (outside)
        pending = entry.symlink_target.split("/") + pending
    entry = by_path.get("/".join(done)) if done else None
    return entry if entry is not None and not entry.is_dir and entry.symlink_target is None else None
