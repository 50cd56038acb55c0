"""The journal of workspace writes (writes.py), and recovery from one a killed agent left.

Each write records its targets in ``<ws>/.execbox-journal/<token>.json`` before it stages
anything; its temp and backup files are named after the token (``.execbox-<token>-<i>``, ``...b``)
beside their targets. A batch of several files is marked committed (fsynced) before its first
rename. ``recover``, run by the next agent before any user code, undoes what is not marked and
rolls forward what is (writes.py's docstring).
"""

from __future__ import annotations

import os

from .fileops import FileOpError, _resolve
from .lean import dumps, loads

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any

PREFIX = ".execbox-"
JOURNAL = ".execbox-journal"  # in the workspace root (agent/main.py looks for it at start)


def unlink_quiet(p: str) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


class Journal:
    """One write's record in ``<ws>/.execbox-journal/<token>.json``: its targets, relative to the
    workspace; its temp and backup files are named after ``token`` (see the module docstring)."""

    def __init__(self, ws: str, items: list[Any]) -> None:
        root = os.path.realpath(ws)
        self.dir = os.path.join(root, JOURNAL)
        token = os.urandom(6).hex()
        self.path = os.path.join(self.dir, token + ".json")
        self.targets = [os.path.relpath(item.real, root) for item in items]
        for i, item in enumerate(items):
            item.tmp, item.backup_name = _names(item.real, token, i)
        try:
            os.mkdir(self.dir, 0o700)
        except FileExistsError:
            pass
        try:  # written whole before anything is staged: a torn one is never read (nothing to undo)
            self._write(self.path, os.O_EXCL, self._record(False))
        except BaseException:
            self.close()
            raise

    def _record(self, committed: bool) -> bytes:
        return dumps({"v": 1, "committed": committed, "targets": self.targets}).encode()

    @staticmethod
    def _write(path: str, flag: int, data: bytes, durable: bool = False) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | flag | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)

    def mark_committed(self) -> None:
        """From here on, recovery rolls the write forward: the mark reaches the disk (the new
        record fsynced, renamed over the old, the directory fsynced) before the first rename."""
        new = self.path + ".new"
        self._write(new, os.O_TRUNC, self._record(True), durable=True)
        os.replace(new, self.path)
        dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def close(self) -> None:
        unlink_quiet(self.path + ".new")
        unlink_quiet(self.path)
        try:
            os.rmdir(self.dir)  # the workspace shows nothing of a write once it is done
        except OSError:
            pass


def _names(real: str, token: str, i: int) -> tuple[str, str]:
    base = os.path.join(os.path.dirname(real), f"{PREFIX}{token}-{i}")
    return base, base + "b"


def recover(ws: str) -> int:
    """Finish or undo the writes a killed agent left (the module docstring); the number of
    journals handled. Runs before any user code at the agent's start. The journal is in the
    workspace, so user code could have written it: every target goes through the one path
    validator and only files named after the journal, beside their target, are touched."""
    root = os.path.realpath(ws)
    jdir = os.path.join(root, JOURNAL)
    try:
        names = os.listdir(jdir)
    except OSError:
        return 0
    done = 0
    for name in names:
        path = os.path.join(jdir, name)
        token = name[:-5] if name.endswith(".json") else ""
        if len(token) == 12 and all(c in "0123456789abcdef" for c in token):
            try:
                with open(path, "rb") as f:
                    record = loads(f.read(1 << 20))
                _recover_one(ws, token, bool(record.get("committed")), record.get("targets") or [])
                done += 1
            except (OSError, ValueError, TypeError, AttributeError, FileOpError):
                pass
        unlink_quiet(path)
    try:
        os.rmdir(jdir)
    except OSError:
        pass
    return done


def _recover_one(ws: str, token: str, committed: bool, targets: list[Any]) -> None:
    for i, rel in enumerate(targets):
        if not isinstance(rel, str):
            continue
        real = _resolve(ws, rel)
        tmp, backup = _names(real, token, i)
        if committed and os.path.lexists(tmp):
            os.replace(tmp, real)
        elif not committed and os.path.lexists(backup) and not os.path.lexists(real):
            os.replace(backup, real)  # moved aside (no hard link) and never replaced: it comes back
        unlink_quiet(tmp)
        unlink_quiet(backup)
