"""The journal of workspace writes (writes.py), and recovery from one a killed agent left.

Each write records its targets in ``<ws>/.execbox-journal/<token>.json`` before it stages
anything; its temp and backup files are named after the token (``.execbox-<token>-<i>``, ``...b``)
beside their targets. A batch of several files is marked committed (fsynced) before its first
rename. ``recover``, run by the next agent before any user code, undoes what is not marked and
rolls forward what is (writes.py's docstring).
"""

from __future__ import annotations

import os
import stat

from .fileops import FileOpError, _resolve, write_file
from .lean import dumps, loads

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any

PREFIX = ".execbox-"
JOURNAL = ".execbox-journal"  # in the workspace root (agent/main.py looks for it at start)
MAX_TARGETS = 10000  # per write, as the HTTP copy route allows; a larger write goes unjournaled
MAX_RECOVERED = 20000  # targets one start works through; a workspace's journals past it are dropped
MAX_JOURNAL_BYTES = 16 << 20


def unlink_quiet(p: str) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


class Journal:
    """One write's record in ``<ws>/.execbox-journal/<token>.json``: its targets and the
    directories it makes, relative to the workspace; its temp and backup files are named after
    ``token`` (see the module docstring). Where no journal can be kept (user code made the
    workspace root read-only, or put a file by that name there; a write of more than
    MAX_TARGETS files) the write goes on without one, crash-safe only while its agent lives."""

    def __init__(self, ws: str, items: list[Any]) -> None:
        root = os.path.realpath(ws)
        self.dir = os.path.join(root, JOURNAL)
        token = os.urandom(6).hex()
        self.path: str | None = os.path.join(self.dir, token + ".json")
        self.targets = [os.path.relpath(item.real, root) for item in items]
        self.dirs = list(dict.fromkeys(os.path.relpath(d, root) for item in items for d in item.missing))
        for i, item in enumerate(items):
            item.tmp, item.backup_name = _names(item.real, token, i)
        if len(items) > MAX_TARGETS:
            self.path = None
            return
        try:
            os.mkdir(self.dir, 0o700)
        except FileExistsError:
            pass
        except OSError:
            self.path = None
            return
        try:  # written whole before anything is staged: a torn one is never read (nothing to undo)
            write_file(self.path, self._record(False))
        except OSError:  # not a directory we can write (or a quota): the write goes on without
            unlink_quiet(self.path)
            self.path = None

    def _record(self, committed: bool) -> bytes:
        return dumps({"v": 1, "committed": committed, "targets": self.targets, "dirs": self.dirs}).encode()

    def mark_committed(self) -> None:
        """From here on, recovery rolls the write forward: the mark reaches the disk (the new
        record fsynced, renamed over the old, the directory fsynced) before the first rename."""
        if self.path is None:
            return
        new = self.path + ".new"
        write_file(new, self._record(True), os.O_TRUNC, durable=True)
        os.replace(new, self.path)
        dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def close(self) -> None:
        if self.path is None:
            return
        unlink_quiet(self.path + ".new")
        unlink_quiet(self.path)
        try:
            os.rmdir(self.dir)  # the workspace shows nothing of a write once it is done
        except OSError:
            pass


def _names(real: str, token: str, i: int) -> tuple[str, str]:
    base = os.path.join(os.path.dirname(real), f"{PREFIX}{token}-{i}")
    return base, base + "b"


def _token_of(name: str) -> str | None:
    """The token of a journal's file name (``<12 hex>.json`` or ``.json.new``), else None."""
    token = name.split(".", 1)[0]
    if name in (token + ".json", token + ".json.new") and len(token) == 12 and \
            all(c in "0123456789abcdef" for c in token):
        return token
    return None


def recover(ws: str) -> int:
    """Finish or undo the writes a killed agent left (the module docstring); the number of
    journals handled. Runs before any user code at the agent's start.

    The journal is in the workspace, so user code could have written it, or anything in its
    place: only a real directory (never a symlink) is read, only regular files named like a
    journal are opened (non-blocking, never through a link) and only those are removed, every
    target goes through the one path validator (the root refused), only files named after the
    journal beside their target are touched, and the work is bounded (MAX_RECOVERED targets,
    MAX_JOURNAL_BYTES a journal): whatever is in there, the agent starts."""
    root = os.path.realpath(ws)
    try:
        dfd = os.open(os.path.join(root, JOURNAL), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return 0
    done = budget = 0
    try:
        for name in os.listdir(dfd):
            token = _token_of(name)
            if token is None:
                continue
            if name.endswith(".json") and budget < MAX_RECOVERED:
                try:
                    record = _read_journal(dfd, name)
                    targets, dirs = record.get("targets") or [], record.get("dirs") or []
                    if isinstance(targets, list) and isinstance(dirs, list):
                        budget += len(targets)
                        if budget <= MAX_RECOVERED:
                            _recover_one(ws, root, token, record.get("committed") is True, targets, dirs)
                            done += 1
                except Exception:  # noqa: BLE001 - a journal user code wrote: it must not stop the start
                    pass
            try:
                os.unlink(name, dir_fd=dfd)
            except OSError:
                pass
    finally:
        os.close(dfd)
    try:
        os.rmdir(os.path.join(root, JOURNAL))
    except OSError:
        pass
    return done


def _read_journal(dfd: int, name: str) -> dict[str, Any]:
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_JOURNAL_BYTES:
            raise ValueError("not a journal")
        data = b""
        while chunk := os.read(fd, 1 << 20):
            data += chunk
            if len(data) > MAX_JOURNAL_BYTES:
                raise ValueError("not a journal")
    finally:
        os.close(fd)
    record = loads(data)
    if not isinstance(record, dict):
        raise ValueError("not a journal")
    return record


def _recover_one(ws: str, root: str, token: str, committed: bool, targets: list[Any], dirs: list[Any]) -> None:
    for i, rel in enumerate(targets):
        if not isinstance(rel, str):
            continue
        try:
            real = _resolve(ws, rel)
        except FileOpError:
            continue
        if real == root:
            continue
        tmp, backup = _names(real, token, i)
        if committed and os.path.lexists(tmp):
            os.replace(tmp, real)
        elif not committed and os.path.lexists(backup) and not os.path.lexists(real):
            os.replace(backup, real)  # moved aside (no hard link) and never replaced: it comes back
        unlink_quiet(tmp)
        unlink_quiet(backup)
    if not committed:  # undone: the directories it made go too, when nothing else is in them
        for rel in reversed(dirs):
            if isinstance(rel, str):
                try:
                    d = _resolve(ws, rel)
                    if d != root:
                        os.rmdir(d)
                except (OSError, FileOpError):
                    pass
