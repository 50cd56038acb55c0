"""Workspace file operations, all through ``paths.resolve``. Never a shell command.

Writes are atomic (temp file in the same directory, fsync, rename): a failed write leaves the
old file untouched. ``write_many`` stages every file first and renames only when all succeeded.
"""

from __future__ import annotations

import errno
import os
import stat

from . import paths
from .lean import b64decode

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    import re
    from typing import Any

MAX_READ_BYTES = 64 * 1024 * 1024
MAX_GREP_FILE_BYTES = 8 * 1024 * 1024
MAX_WALK_ENTRIES = 200_000


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


def _resolve(ws: str, path: str, must_exist: bool = False) -> str:
    try:
        return paths.resolve(ws, path, must_exist=must_exist)
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
    return FileOpError(f"{os.strerror(e.errno or 0)}: {path!r}", path=path)


def _open_read(real: str, path: str) -> int:
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise _os_error(e, path) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileOpError(f"{path!r} is not a regular file", path=path)
    return fd


def read_bytes(ws: str, path: str, max_bytes: int = MAX_READ_BYTES) -> bytes:
    real = _resolve(ws, path, must_exist=True)
    fd = _open_read(real, path)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise FileOpError(f"{path!r} is {size} bytes, over the {max_bytes} byte limit", status=413)
        return f.read()


def read_text(ws: str, path: str, offset: int = 0, limit: int = 2000) -> dict[str, Any]:
    """Lines [offset, offset+limit) of a text file, with the total line count."""
    if offset < 0 or limit <= 0:
        raise FileOpError("offset must be >= 0 and limit > 0", field="offset" if offset < 0 else "limit")
    data = read_bytes(ws, path)
    if b"\x00" in data[:8192]:
        raise FileOpError(f"{path!r} looks binary; use read_binary", path=path)
    lines = data.decode("utf-8", errors="replace").splitlines(keepends=True)
    page = lines[offset : offset + limit]
    return {
        "path": _syntax(path, "path"),
        "content": "".join(page),
        "offset": offset,
        "limit": limit,
        "total_lines": len(lines),
        "truncated": offset + limit < len(lines),
    }


def _stage(ws: str, path: str, data: bytes, append: bool) -> tuple[str, str]:
    """Write the final content to a temp file beside the target; return (temp, target)."""
    real = _resolve(ws, path)
    if real == os.path.realpath(ws):
        raise FileOpError("cannot write to the workspace root itself", field="path")
    parent = os.path.dirname(real)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise _os_error(e, path) from None
    # Re-check after makedirs: a directory created through a racing symlink must not escape.
    _resolve(ws, os.path.relpath(parent, os.path.realpath(ws)))
    if os.path.isdir(real) and not os.path.islink(real):
        raise FileOpError(f"{path!r} is a directory", path=path)
    if append and os.path.lexists(real):
        data = read_bytes(ws, path) + data
    import tempfile  # noqa: PLC0415 - pulls in shutil and random: kept off the box's start-up path

    fd, tmp = tempfile.mkstemp(prefix=".execbox-", dir=parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        _unlink_quiet(tmp)
        raise _os_error(e, path) from None
    return tmp, real


def _unlink_quiet(p: str) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


def _decode_content(item: dict[str, Any]) -> bytes:
    if item.get("content_b64") is not None:
        try:
            return b64decode(item["content_b64"])
        except (ValueError, TypeError):
            raise FileOpError("content_b64 is not valid base64", field="content_b64") from None
    content = item.get("content", "")
    if not isinstance(content, str):
        raise FileOpError("content must be a string", field="content")
    return content.encode("utf-8")


def write(ws: str, path: str, data: bytes, mode: str = "overwrite") -> dict[str, Any]:
    if mode not in ("overwrite", "append", "create"):
        raise FileOpError(f"unknown write mode {mode!r}; use overwrite, append or create", field="mode")
    if mode == "create" and os.path.lexists(_resolve(ws, path)):
        raise FileOpError(f"{path!r} already exists", status=409, path=path)
    tmp, real = _stage(ws, path, data, append=mode == "append")
    os.replace(tmp, real)
    return info(ws, real)


def write_many(ws: str, files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """All or none: stage every file, then rename; on any failure remove what was staged."""
    staged: list[tuple[str, str]] = []
    try:
        for item in files:
            data = _decode_content(item)
            staged.append(_stage(ws, item.get("path", ""), data, append=False))
    except BaseException:
        for tmp, _ in staged:
            _unlink_quiet(tmp)
        raise
    for tmp, real in staged:
        os.replace(tmp, real)
    return [info(ws, real) for _, real in staged]


def info(ws: str, real: str) -> dict[str, Any]:
    st = os.lstat(real)
    return {
        "path": paths.relative(ws, real),
        "size": st.st_size,
        "is_dir": stat.S_ISDIR(st.st_mode),
        "modified": st.st_mtime,
    }


def _walk(ws: str, start: str):
    """Yield real paths under ``start`` without following symlinked directories."""
    count = 0
    for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".execbox-"))
        for name in sorted(dirnames) + sorted(filenames):
            count += 1
            if count > MAX_WALK_ENTRIES:
                return
            yield os.path.join(dirpath, name)


def list_dir(ws: str, path: str = ".", recursive: bool = False) -> list[dict[str, Any]]:
    real = _resolve(ws, path, must_exist=True)
    if not os.path.isdir(real):
        raise FileOpError(f"{path!r} is not a directory", path=path)
    if recursive:
        entries = list(_walk(ws, real))
    else:
        entries = [os.path.join(real, n) for n in sorted(os.listdir(real))]
    return [info(ws, e) for e in entries if not os.path.basename(e).startswith(".execbox-")]


def glob(ws: str, pattern: str, max_results: int = 1000) -> list[str]:
    """Match workspace-relative paths; ``**`` spans directories. Pure Python, no shell."""
    pat = _syntax(pattern, "pattern") if pattern not in ("", ".") else "*"
    regex = _glob_regex(pat)
    root = os.path.realpath(ws)
    out = []
    for real in _walk(ws, root):
        rel = os.path.relpath(real, root)
        if regex.fullmatch(rel):
            out.append(rel)
            if len(out) >= max_results:
                break
    return out


def _glob_regex(pattern: str) -> re.Pattern[str]:
    import fnmatch  # noqa: PLC0415 - with re, ~6 ms of every box start if imported up front
    import re  # noqa: PLC0415

    parts = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            parts.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            parts.append(".*")
            i += 2
        else:
            ch = pattern[i]
            if ch == "*":
                parts.append("[^/]*")
            elif ch == "?":
                parts.append("[^/]")
            elif ch == "[":
                j = pattern.find("]", i + 1)
                if j == -1:
                    parts.append(re.escape(ch))
                else:
                    parts.append(fnmatch.translate(pattern[i : j + 1])[4:-3])
                    i = j
            else:
                parts.append(re.escape(ch))
            i += 1
    return re.compile("".join(parts), re.DOTALL)


def grep(
    ws: str,
    pattern: str,
    path: str = ".",
    glob_pattern: str | None = None,
    max_results: int = 100,
    ignore_case: bool = False,
) -> dict[str, Any]:
    """Regex search over text files; binary and oversized files are skipped."""
    if not pattern:
        raise FileOpError("pattern must not be empty", field="pattern")
    import re  # noqa: PLC0415 - lazily, as in _glob_regex

    try:
        rx = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as e:
        raise FileOpError(f"invalid regular expression: {e}", field="pattern") from None
    real = _resolve(ws, path, must_exist=True)
    files = [real] if os.path.isfile(real) else [p for p in _walk(ws, real) if os.path.isfile(p)]
    name_rx = _glob_regex(_syntax(glob_pattern, "glob")) if glob_pattern else None
    matches: list[dict[str, Any]] = []
    truncated = False
    for f in files:
        rel = paths.relative(ws, f)
        if os.path.islink(f):
            continue
        if name_rx and not (name_rx.fullmatch(rel) or name_rx.fullmatch(os.path.basename(rel))):
            continue
        try:
            if os.path.getsize(f) > MAX_GREP_FILE_BYTES:
                continue
            with open(f, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        if b"\x00" in data[:8192]:
            continue
        for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if rx.search(line):
                if len(matches) >= max_results:
                    truncated = True
                    break
                matches.append({"path": rel, "line_number": n, "line": line[:2000]})
        if truncated:
            break
    return {"matches": matches, "truncated": truncated}


def delete(ws: str, path: str) -> None:
    real = _resolve(ws, path, must_exist=True)
    if real == os.path.realpath(ws):
        raise FileOpError("cannot delete the workspace root", field="path")
    try:
        if os.path.isdir(real) and not os.path.islink(real):
            import shutil

            shutil.rmtree(real)
        else:
            os.unlink(real)
    except OSError as e:
        raise _os_error(e, path) from None


def remove_tree(path: str) -> None:
    """``shutil.rmtree(path, ignore_errors=True)`` for the agent's own temp dir at exit.

    Importing shutil (and the re, bz2 and lzma it imports) cost ~7 ms of every box's shutdown.
    Descriptor-relative like shutil's own: a symlink inside is removed, never followed."""
    try:
        for _root, dirs, files, dfd in os.fwalk(path, topdown=False):
            for name in files:
                _quiet(os.unlink, name, dfd)
            for name in dirs:  # a symlink to a directory is listed here too: rmdir fails, unlink works
                if not _quiet(os.rmdir, name, dfd):
                    _quiet(os.unlink, name, dfd)
        os.rmdir(path)
    except OSError:
        pass


def _quiet(fn: Any, name: str, dfd: int) -> bool:
    try:
        fn(name, dir_fd=dfd)
        return True
    except OSError:
        return False
