"""Workspace file operations, all through ``paths.resolve``. Never a shell command.

Reading, listing and removing live here; writes (atomic, a batch all or none) in ``writes``,
glob and grep (grep in a child with a time limit) in ``search``. A file is opened only if it is
a regular file, checked without blocking (a FIFO or device never stalls the agent). Remove acts
on the last component itself (a symlink is removed, never followed).
"""

from __future__ import annotations

import errno
import os
import stat

from . import paths

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from typing import Any

MAX_READ_BYTES = 64 * 1024 * 1024
TEXT_REPLY_MAX = 32 * 1024 * 1024
"""Bytes a text read's content may take in its reply frame (JSON-escaped: a control character or
an undecodable byte is 6 bytes there). The host refuses frames past ~96 MiB as a broken box
(boxes/agent_client.py), so a page stops here and says ``truncated``."""
MAX_WALK_ENTRIES = 200_000
SNIFF_BYTES = 8192
"""A file with a NUL byte in its first 8 KiB is binary (GNU grep and git decide so too)."""
CHUNK = 1 << 20
LINE_COUNT_MAX_BYTES = 1 << 30
"""A text read counts the lines after its page through at most this many bytes (~0.7 s), so a
page of a huge file never holds the agent long; past it ``total_lines`` is a lower bound."""


class FileOpError(Exception):
    """An error with an SB code and HTTP status the host maps to its exception classes."""

    def __init__(self, message: str, *, status: int = 400, code: str = "SB002", **details: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.details = details


def _syntax(path: str, field: str) -> str:
    try:
        return paths.check_syntax(path)
    except paths.PathViolation as e:
        raise FileOpError(str(e), field=field, path=e.path, violation=e.reason) from None


def _resolve(ws: str, path: str, must_exist: bool = False, follow: bool = True) -> str:
    try:
        return paths.resolve(ws, path, must_exist=must_exist, follow=follow)
    except paths.PathViolation as e:
        raise FileOpError(str(e), field="path", path=e.path, violation=e.reason) from None
    except FileNotFoundError:
        raise FileOpError(f"no such file: {path!r}", status=404, path=path) from None


def _os_error(e: OSError, path: str) -> FileOpError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return FileOpError(f"workspace quota exceeded while writing {path!r}", status=507, path=path)
    if e.errno == errno.ENOENT:
        return FileOpError(f"no such file: {path!r}", status=404, path=path)
    if e.errno == errno.EISDIR:
        return FileOpError(f"{path!r} is a directory", path=path)
    if e.errno == errno.EFBIG:
        return FileOpError(f"file too large: {path!r}", status=413, path=path)
    if e.errno == errno.ENOTDIR:
        return FileOpError(f"a parent of {path!r} is not a directory", path=path)
    if e.errno == errno.ENAMETOOLONG:
        return FileOpError(f"name too long: {path!r}", path=path)
    if e.errno == errno.EEXIST:
        return FileOpError(f"{path!r} already exists", status=409, path=path)
    # The user's path only: never the OSError's own text, which names the box's real paths.
    return FileOpError(f"{os.strerror(e.errno) if e.errno else type(e).__name__}: {path!r}", path=path)


def open_regular(real: str, path: str) -> int:
    """A read-only descriptor of ``real`` if it is a regular file; FileOpError otherwise.

    Opened with O_NONBLOCK, so a FIFO without a writer (or a device) is refused instead of
    blocking the agent, then checked with fstat and switched back to blocking reads."""
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise _os_error(e, path) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
                "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) \
                else "not a regular file"
            raise FileOpError(f"{path!r} is {kind}, not a regular file", path=path, kind=kind)
        os.set_blocking(fd, True)
    except BaseException as e:
        os.close(fd)
        if isinstance(e, OSError):
            raise _os_error(e, path) from None
        raise
    return fd



def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to the (blocking) ``fd``: os.write may take less."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_file(path: str, data: bytes, flag: int = os.O_EXCL, durable: bool = False) -> None:
    """``data`` to ``path``, opened with ``flag`` (O_EXCL: a new file; O_TRUNC) and never
    through a symlink, mode 0600; fsynced when ``durable``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flag | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        write_all(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_bytes(ws: str, path: str, max_bytes: int = MAX_READ_BYTES) -> bytes:
    """A whole file of at most ``max_bytes`` (413 beyond)."""
    return read_range(ws, path, max_bytes=max_bytes)[0]


def read_range(ws: str, path: str, offset: int | None = None, length: int | None = None,
               max_bytes: int = MAX_READ_BYTES, hint: str = "") -> tuple[bytes, int]:
    """``(bytes, the file's size)``: ``length`` bytes from ``offset`` (fewer at the end of the
    file), or without ``length`` all from ``offset`` on, which must fit ``max_bytes`` (413 beyond,
    ``hint`` added to the message). Only the bytes asked for are read, whatever the file's size."""
    for name, value in (("offset", offset), ("length", length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise FileOpError(f"{name} must be a whole number of bytes >= 0", field=name)
    if length is not None and length > max_bytes:
        raise FileOpError(f"length {length} is over the {max_bytes} byte limit of one read", field="length",
                          limit=max_bytes)
    real = _resolve(ws, path, must_exist=True)
    fd = open_regular(real, path)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        start = offset or 0
        if start > size:
            raise FileOpError(f"offset {start} is past the end of {path!r} ({size} bytes)", field="offset",
                              path=path, size=size)
        want = size - start if length is None else min(length, size - start)
        if want > max_bytes:
            where = f"{size} bytes" if not start else f"{size} bytes ({want} from offset {start})"
            raise FileOpError(f"{path!r} is {where}, over the {max_bytes} byte limit of one read{hint}",
                              status=413, path=path, size=size, limit=max_bytes)
        try:
            if start:
                f.seek(start)
            return f.read(want), size
        except OSError as e:
            raise _os_error(e, path) from None


def read_text(ws: str, path: str, offset: int = 0, limit: int = 2000) -> dict[str, Any]:
    """Lines [offset, offset+limit) of a text file, with the total line count. A line ends at
    ``\n`` (``\r\n`` kept in the content), as for grep's line numbers and ``wc -l``.

    Streamed, so a file of any size can be paged: the lines before ``offset`` are skipped by
    counting newlines a chunk at a time, only the page is held, and the lines after it are
    counted through at most ``LINE_COUNT_MAX_BYTES`` (past that ``total_lines`` is a lower
    bound; the page says ``truncated``)."""
    if offset < 0 or limit <= 0:
        raise FileOpError("offset must be >= 0 and limit > 0", field="offset" if offset < 0 else "limit")
    real = _resolve(ws, path, must_exist=True)
    fd = open_regular(real, path)
    with os.fdopen(fd, "rb") as f:
        try:
            if b"\x00" in f.read(SNIFF_BYTES):
                raise FileOpError(f"{path!r} looks binary (a NUL byte in its first 8 KiB); use read_binary",
                                  path=path, reason="binary")
            f.seek(0)
            before, last = _skip_lines(f, offset)
            raw, cut = _page(f, limit)
            after, rest_last, more = _count_newlines(f, LINE_COUNT_MAX_BYTES)
        except OSError as e:
            raise _os_error(e, path) from None
    last = rest_last or (raw[-1][-1:] if raw else last)
    page, cut_escaped = _bounded([line.decode("utf-8", errors="replace") for line in raw])
    newlines = before + sum(1 for line in raw if line.endswith(b"\n")) + after
    return {
        "path": _syntax(path, "path"),
        "content": "".join(page),
        "offset": offset,
        "limit": limit,
        "total_lines": newlines + (1 if last not in (b"", b"\n") else 0),
        "truncated": cut or cut_escaped or more,
    }


def _skip_lines(f: Any, n: int) -> tuple[int, bytes]:
    """Move ``f`` to the start of line ``n`` (0-based): the newlines passed (fewer than ``n`` when
    the file ends first), and then the file's last byte."""
    done = pos = 0
    last = b""
    while done < n:
        chunk = f.read(CHUNK)
        if not chunk:
            return done, last
        count = chunk.count(b"\n")
        if done + count >= n:
            i = -1
            for _ in range(n - done):
                i = chunk.index(b"\n", i + 1)
            f.seek(pos + i + 1)
            return n, b""
        done += count
        pos += len(chunk)
        last = chunk[-1:]
    return done, b""


def _page(f: Any, limit: int) -> tuple[list[bytes], bool]:
    """Up to ``limit`` lines from ``f``'s position, at most ``TEXT_REPLY_MAX`` bytes in all (they
    only grow once escaped); whether a line was cut there."""
    lines: list[bytes] = []
    budget = TEXT_REPLY_MAX + 1
    while len(lines) < limit and budget > 0:
        line = f.readline(budget)
        if not line:
            break
        lines.append(line)
        budget -= len(line)
    return lines, budget <= 0


def _count_newlines(f: Any, max_bytes: int) -> tuple[int, bytes, bool]:
    """Newlines from ``f``'s position through at most ``max_bytes``: (count, the last byte read,
    whether any byte was there)."""
    count = seen = 0
    last = b""
    while seen < max_bytes:
        chunk = f.read(min(CHUNK, max_bytes - seen))
        if not chunk:
            break
        count += chunk.count(b"\n")
        seen += len(chunk)
        last = chunk[-1:]
    return count, last, seen > 0


def _bounded(lines: list[str]) -> tuple[list[str], bool]:
    """The leading lines whose escaped size fits ``TEXT_REPLY_MAX`` (a longer first line is cut
    to what surely fits: 12 bytes a character at worst), and whether anything was left out."""
    from .lean import dumps

    page: list[str] = []
    size = 0
    for line in lines:
        size += len(dumps(line))
        if size > TEXT_REPLY_MAX:
            if not page:
                page.append(line[: TEXT_REPLY_MAX // 12])
            return page, True
        page.append(line)
    return page, False


_KINDS = ((stat.S_ISREG, "file"), (stat.S_ISDIR, "dir"), (stat.S_ISLNK, "symlink"), (stat.S_ISFIFO, "fifo"),
          (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "device"), (stat.S_ISBLK, "device"))


def info(ws: str, real: str) -> dict[str, Any]:
    """An entry as it is (lstat: a symlink is never followed): ``kind`` says what it is (``file``,
    ``dir``, ``symlink``, ``fifo``, ``socket``, ``device``, ``other``); a symlink's text is in
    ``symlink_target`` (left out when it is not valid UTF-8: no reply could carry it)."""
    st = os.lstat(real)
    out = {
        "path": paths.relative(ws, real),
        "size": st.st_size,
        "is_dir": stat.S_ISDIR(st.st_mode),
        "modified": st.st_mtime,
        "kind": next((name for test, name in _KINDS if test(st.st_mode)), "other"),
    }
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(real)
            target.encode("utf-8")
            out["symlink_target"] = target
        except (OSError, UnicodeEncodeError):
            pass
    return out


def _walk(ws: str, start: str, skipped: paths.Skipped | None = None):
    """Yield real paths under ``start`` without following symlinked directories.

    ``os.walk``'s order (each directory's subdirectories, then its files, each sorted; then into
    the subdirectories in turn) as a loop: ``os.walk`` recurses once per level before Python 3.12,
    so a tree ~1000 levels deep raised RecursionError. Names that are not valid UTF-8 are left out
    (a directory with its whole subtree) and counted in ``skipped``: no reply could carry them."""
    skipped = skipped if skipped is not None else paths.Skipped()
    count = 0
    stack = [start]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = list(it)
        except OSError:  # gone, unreadable, or too long a path: left out, as os.walk does
            continue
        dirnames, filenames = [], []
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # a symlink to a directory is listed as one (not walked into)
            except OSError:
                is_dir = False
            (dirnames if is_dir else filenames).append(entry.name)
        dirnames = sorted(skipped.keep([d for d in dirnames if not d.startswith(".execbox-")]))
        for name in dirnames + sorted(skipped.keep([f for f in filenames if not f.startswith(".execbox-")])):
            count += 1
            if count > MAX_WALK_ENTRIES:
                return
            yield os.path.join(top, name)
        stack.extend(p for p in (os.path.join(top, d) for d in reversed(dirnames)) if not os.path.islink(p))


def list_dir(ws: str, path: str = ".", recursive: bool = False) -> dict[str, Any]:
    """The ``files.list`` reply: ``files``, and ``skipped_names`` when names not valid UTF-8 were left out."""
    real = _resolve(ws, path, must_exist=True)
    if not os.path.isdir(real):
        raise FileOpError(f"{path!r} is not a directory", path=path)
    skipped = paths.Skipped()
    try:
        entries = list(_walk(ws, real, skipped)) if recursive else [
            os.path.join(real, n) for n in sorted(skipped.keep(os.listdir(real)))]
    except OSError as e:
        raise _os_error(e, path) from None
    out = []
    for e in entries:
        if os.path.basename(e).startswith(".execbox-"):
            continue
        try:
            out.append(info(ws, e))
        except OSError:  # removed by the box's own code while listed
            continue
    return {"files": out, **skipped.reply()}


def delete(ws: str, path: str) -> None:
    """Remove a file, a symlink (itself, wherever it points) or a directory tree."""
    real = _resolve(ws, path, must_exist=True, follow=False)
    if real == os.path.realpath(ws):
        raise FileOpError("cannot delete the workspace root", field="path")
    try:
        if stat.S_ISDIR(os.lstat(real).st_mode):
            _remove_dir(real, strict=True)  # symlinks inside are removed, never followed
        else:
            os.unlink(real)
    except TreeChanged:
        raise FileOpError(f"{path!r} changed while it was being deleted (a directory in it was moved); "
                          "delete it again", status=409, path=path) from None
    except OSError as e:
        raise _os_error(e, path) from None


def remove_tree(path: str) -> None:
    """``shutil.rmtree(path, ignore_errors=True)`` for the agent's own temp dir at exit.

    Importing shutil (and the re, bz2 and lzma it imports) cost ~7 ms of every box's shutdown."""
    try:
        _remove_dir(path, strict=False)
    except OSError:
        pass


class TreeChanged(OSError):
    """A directory being removed was moved out from under the removal (found going back up)."""


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _remove_dir(real: str, strict: bool) -> None:
    """Remove the directory ``real`` (not a symlink) and everything in it, as a loop.

    ``shutil.rmtree`` and ``os.fwalk`` recurse once per level (RecursionError past ~1000 before
    Python 3.12) and hold a descriptor per level (a box allows 1024). This holds one: it works
    descriptor-relative, descends with O_NOFOLLOW (a symlink inside is unlinked, never followed,
    even one swapped in for a directory after it was listed), and climbs back through ``..``,
    checking that it reached the very directory it came from (else TreeChanged: never a
    directory outside the tree). ``strict=False`` skips what cannot be removed."""
    fd = os.open(real, _DIR_FLAGS)
    ids = [_identity(fd)]  # (st_dev, st_ino) of each level from ``real`` down to the current one
    names: list[str] = []  # each level's name in the one above it
    try:
        todo = [_clear_dir(fd, strict)]  # each level's subdirectories still to remove
        while True:
            if todo[-1]:
                name = todo[-1].pop()
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    continue
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):  # no longer a directory: the entry itself
                        _unlink_at(name, fd, strict)
                    elif strict:
                        raise
                    continue
                os.close(fd)
                fd = child
                ids.append(_identity(fd))
                names.append(name)
                todo.append(_clear_dir(fd, strict))
                continue
            if not names:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            ids.pop()
            todo.pop()
            if _identity(fd) != ids[-1]:
                raise TreeChanged(errno.ESTALE, "a directory moved while its tree was removed")
            name = names.pop()
            try:
                os.rmdir(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError:
                if strict:
                    raise
    finally:
        os.close(fd)
    os.rmdir(real)


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _clear_dir(fd: int, strict: bool) -> list[str]:
    """Unlink what the directory ``fd`` holds other than directories; the names of those."""
    with os.scandir(fd) as it:
        entries = list(it)
    dirs = []
    for entry in entries:
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if is_dir:
            dirs.append(entry.name)
        else:
            _unlink_at(entry.name, fd, strict)
    return dirs


def _unlink_at(name: str, fd: int, strict: bool) -> None:
    try:
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass
    except OSError:
        if strict:
            raise
