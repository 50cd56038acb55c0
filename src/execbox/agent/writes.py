"""Workspace writes, one file or a batch, all or none. Every path through ``paths.resolve``.

Three phases, so a refused or failed write leaves the workspace as it was:

1. plan (touches nothing): resolve each path, refuse the workspace root, a path ending in ``/``
   or ``/.`` (``paths.names_directory``: writing the file ``dir`` for ``dir/`` would surprise),
   names over NAME_MAX and paths over PATH_MAX (``paths``), a target that is a directory, a parent that is a file (on
   disk, or another file of the same batch: ``f`` and ``f/g``), ``create`` over an existing file;
2. stage: make the missing parent directories (remembering which), write each file's content to
   a temp file beside its target and fsync it;
3. commit: keep each existing target as a hard link (or, where links fail, renamed) beside it,
   then rename the temp file over the target.

Any error in phase 2 or 3 undoes what was done: committed targets get their old content back (or
are removed if they were new), temp files are removed, directories the batch made are removed.
OSErrors become request errors (``fileops._os_error``) that name the user's path, never a temp
file's. Temp and backup files are named ``.execbox-*`` (hidden from list, glob and grep).

A write the agent does not live to finish (its box or the service killed mid-write) is finished
by ``write_journal.recover`` when the next agent starts on the workspace, from a journal in ``.execbox-journal/``
written before anything is staged: it names the write's targets, and its temp and backup files
are named after the journal (``.execbox-<token>-<i>``, ``...b``). Until a batch of several files
is marked committed (the mark is fsynced before the first rename), recovery undoes it: temp files
go, a target moved aside comes back. After the mark it is rolled forward: every temp file left is
renamed over its target. So a copy of several files is all or nothing across crashes too, and no
temp file is left to hold the workspace's disk quota.
"""

from __future__ import annotations

import os
import stat

from . import paths
from .fileops import FileOpError, _os_error, _resolve, info, read_bytes, write_all
from .lean import b64decode
from .write_journal import JOURNAL, PREFIX, Journal, unlink_quiet

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any

MODES = ("overwrite", "append", "create")


class _Item:
    """One file of a write: the user's path, its resolved target and what was done for it."""

    __slots__ = ("backup", "backup_name", "committed", "data", "missing", "moved", "path", "real", "tmp")

    def __init__(self, path: str, real: str, data: bytes) -> None:
        self.path, self.real, self.data = path, real, data
        self.missing: list[str] = []  # parent directories to make, outermost first
        self.tmp: str | None = None
        self.backup: str | None = None  # set once the old target is kept there
        self.backup_name: str | None = None  # what the journal calls it
        self.moved = False  # the old target was renamed to ``backup`` (no hard link possible)
        self.committed = False


def decode_content(item: dict[str, Any]) -> bytes:
    if not isinstance(item, dict):
        raise FileOpError("each file must be an object with path and content", field="files")
    if item.get("content_b64") is not None:
        try:
            return b64decode(item["content_b64"])
        except (ValueError, TypeError):
            raise FileOpError("content_b64 is not valid base64", field="content_b64") from None
    content = item.get("content", "")
    if not isinstance(content, str):
        raise FileOpError("content must be a string", field="content")
    try:
        return content.encode("utf-8")
    except UnicodeError:
        raise FileOpError("content is not valid UTF-8 text; send content_b64", field="content") from None


def write(ws: str, path: str, data: bytes, mode: str = "overwrite") -> dict[str, Any]:
    if mode not in MODES:
        raise FileOpError(f"unknown write mode {mode!r}; use overwrite, append or create", field="mode")
    return _write(ws, [(path, data)], mode)[0]


def write_many(ws: str, files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """All or none: every file is written, or the workspace is left as it was."""
    entries = []
    for item in files:
        data = decode_content(item)  # refuses a non-object first
        entries.append((item.get("path", ""), data))
    return _write(ws, entries, "overwrite")


def _write(ws: str, entries: list[tuple[str, bytes]], mode: str) -> list[dict[str, Any]]:
    items = _plan(ws, entries, mode)
    if not items:
        return []
    made: list[str] = []
    current = items[0]
    journal = None
    try:
        journal = Journal(ws, items)
        for current in items:
            _stage(ws, current, made)
        if len(items) > 1:
            journal.mark_committed()
        for current in items:
            _commit(current)
    except BaseException as e:
        _rollback(items, made)
        if journal is not None:
            journal.close()
        if isinstance(e, OSError):
            raise _os_error(e, current.path) from None
        raise
    for item in items:
        if item.backup:
            unlink_quiet(item.backup)
    journal.close()
    out = []
    for item in items:
        try:
            out.append(info(ws, item.real))
        except OSError as e:  # changed by the box's own code since: report that, not a traceback
            raise _os_error(e, item.path) from None
    return out


# -- 1. plan: nothing on disk changes --------------------------------------------------------
def _plan(ws: str, entries: list[tuple[str, bytes]], mode: str) -> list[_Item]:
    root = os.path.realpath(ws)
    items = []
    for path, data in entries:
        real = _resolve(ws, path)
        if real == root:
            raise FileOpError("cannot write to the workspace root itself", field="path", path=path)
        if paths.names_directory(path):  # "d/" or "d/." names a directory, as open(2) says (EISDIR)
            raise FileOpError(f"cannot write {path!r}: a path ending in '/' or '/.' names a directory; "
                              "name the file", field="path", path=path)
        if JOURNAL in os.path.relpath(real, root).split(os.sep):
            raise FileOpError(f"cannot write {path!r}: {JOURNAL} is execbox's own (the write journal)",
                              field="path", path=path)
        items.append(_Item(path, real, data))
    targets = {item.real: item for item in items}
    for item in items:
        d = os.path.dirname(item.real)
        while d != root and d.startswith(root + os.sep):
            other = targets.get(d)
            if other is not None:
                raise FileOpError(f"{other.path!r} cannot be a file when {item.path!r} is inside it",
                                  path=item.path, conflict=other.path)
            d = os.path.dirname(d)
    for item in items:
        _check_target(ws, root, item, mode)
    return items


def _check_target(ws: str, root: str, item: _Item, mode: str) -> None:
    try:
        st = os.lstat(item.real)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise _os_error(e, item.path) from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise FileOpError(f"{item.path!r} is a directory", path=item.path)
        if mode == "create":
            raise FileOpError(f"{item.path!r} already exists", status=409, path=item.path)
        if mode == "append":
            item.data = read_bytes(ws, item.path) + item.data  # refuses FIFOs, devices, sockets
        return
    d = os.path.dirname(item.real)
    while d != root and not os.path.lexists(d):
        item.missing.insert(0, d)
        d = os.path.dirname(d)
    if not os.path.isdir(d):
        raise FileOpError(f"cannot write {item.path!r}: {paths.relative(ws, d)!r} is not a directory",
                          path=item.path)


# -- 2. stage -----------------------------------------------------------------------------------
def _stage(ws: str, item: _Item, made: list[str]) -> None:
    for d in item.missing:
        try:
            os.mkdir(d)
            made.append(d)
        except FileExistsError:
            if not os.path.isdir(d):
                raise
    parent = os.path.dirname(item.real)
    # A directory made through a symlink swapped in meanwhile by the box's code must not escape.
    if os.path.realpath(parent) != parent:
        raise FileOpError(f"invalid path {item.path!r}: its directory changed while writing",
                          path=item.path, violation="resolves outside the workspace (symlink escape)")
    item.tmp, fd = _create_beside(item.real, item.tmp)
    try:
        write_all(fd, item.data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_beside(real: str, name: str | None = None) -> tuple[str, int]:
    """A new file in ``real``'s directory (``name``, else ``.execbox-<random>``), with ``real``'s
    permissions if it exists (0644 under the usual umask if not)."""
    try:
        perm: int | None = stat.S_IMODE(os.stat(real).st_mode)
    except OSError:
        perm = None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = name or _sibling(real)
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileExistsError:
            if name:  # the journal's name for it: a file by that name is not this write's
                unlink_quiet(name)
            continue
        if perm is not None:
            try:
                os.fchmod(fd, perm)
            except OSError:
                pass
        return tmp, fd
    raise FileExistsError(f"no free temp name beside {real}")


def _sibling(real: str) -> str:
    return os.path.join(os.path.dirname(real), PREFIX + os.urandom(6).hex())


# -- 3. commit, and undo ------------------------------------------------------------------------
def _commit(item: _Item) -> None:
    if os.path.lexists(item.real):
        backup = item.backup_name or _sibling(item.real)
        try:
            os.link(item.real, backup, follow_symlinks=False)
        except OSError:  # no hard links here (or too many): keep it by name instead
            os.rename(item.real, backup)
            item.moved = True
        item.backup = backup
    assert item.tmp is not None
    os.replace(item.tmp, item.real)
    item.tmp = None
    item.committed = True


def _rollback(items: list[_Item], made: list[str]) -> None:
    for item in reversed(items):
        if item.backup and (item.committed or item.moved):
            try:
                os.replace(item.backup, item.real)
            except OSError:
                pass
        elif item.backup:
            unlink_quiet(item.backup)
        elif item.committed:
            unlink_quiet(item.real)
        if item.tmp:
            unlink_quiet(item.tmp)
    for d in reversed(made):
        try:
            os.rmdir(d)  # fails, and keeps it, if the box's code put something there meanwhile
        except OSError:
            pass
