"""Workspace glob and grep, pure Python, never a shell; every path through ``paths.resolve``.

A user's regular expression can backtrack for hours (``(a+)+$`` on a line of a's), and Python's
``re`` cannot be interrupted. So the search runs in a forked child of the agent with a time limit
(``SEARCH_TIMEOUT``, under the host's 60 s for a file op): on expiry the child is killed and the
request answers SB005 (timeout) while the agent, the box and its other runs carry on. Glob's
patterns become regexes too (``**`` spans directories), so glob runs the same way.
"""

from __future__ import annotations

import os
import select
import stat
import time

from . import fileops, paths, procs
from .fileops import FileOpError, _resolve, _syntax, _walk
from .lean import dumps, loads, signal

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    import re
    from collections.abc import Callable, Iterator
    from typing import Any

SEARCH_TIMEOUT = 30.0
LINE_PIECE = 8 * 1024 * 1024
"""grep holds at most this many bytes of one line: a longer line is searched in pieces of this
size (a match across two pieces is missed) and its file is listed in ``skipped`` as ``long_line``."""
MAX_LINE_CHARS = 2000
"""A matching line is returned cut to this many characters."""
MAX_SKIPPED = 100
"""Entries a grep reply's ``skipped`` lists at most."""
LINE_BOUND = r"\\[AZz]|\(\?(?:!|<!|>|\()|[*+?}]\+|\(\?[a-zA-Z-]*x"
"""What a pattern may hold that lets a search across lines miss a match within one line: \\A,
\\Z, negative lookarounds, atomic groups, conditionals, possessive quantifiers, verbose mode.
Such a pattern is tried line by line (slower); any other is tried on a chunk of lines first."""


def time_limit(requested: Any) -> float:
    """The request's ``timeout`` (seconds, tests and callers that want less), capped."""
    if requested is None:
        return SEARCH_TIMEOUT
    if isinstance(requested, bool) or not isinstance(requested, (int, float)) or not requested > 0:
        raise FileOpError("timeout must be a positive number of seconds", field="timeout")
    return min(float(requested), SEARCH_TIMEOUT)


def glob(ws: str, pattern: str, max_results: int = 1000, timeout: float = SEARCH_TIMEOUT) -> dict[str, Any]:
    """The ``files.glob`` reply: workspace-relative ``paths`` that match (``**`` spans
    directories), at most ``max_results`` of them (``truncated`` when more match), and
    ``skipped_names`` when names not valid UTF-8 were left out."""
    pat = _syntax(pattern, "pattern") if pattern not in ("", ".") else "*"
    regex = _glob_regex(pat)
    root = os.path.realpath(ws)

    def search() -> dict[str, Any]:
        out = []
        truncated = False
        skipped = paths.Skipped()
        for real in _walk(ws, root, skipped):
            rel = os.path.relpath(real, root)
            if regex.fullmatch(rel):
                if len(out) >= max_results:
                    truncated = True
                    break
                out.append(rel)
        return {"paths": out, "truncated": truncated, **skipped.reply()}

    return in_child(search, timeout, f"glob {pattern!r}")


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
    timeout: float = SEARCH_TIMEOUT,
) -> dict[str, Any]:
    """Regex search of each line of the regular files under ``path`` (or of the file it names),
    whatever their size. A binary file (a NUL byte in its first 8 KiB) that matches is listed in
    ``binary_matches`` (GNU grep's "Binary file X matches"), its lines not returned; files that
    could not be searched, or only in part, are listed in ``skipped`` with the reason. A file
    named by ``path`` that is not a regular file, or cannot be read, is an error."""
    if not isinstance(pattern, str) or not pattern:
        raise FileOpError("pattern must be a non-empty string", field="pattern")
    import re  # noqa: PLC0415 - lazily, as in _glob_regex

    flags = re.IGNORECASE if ignore_case else 0
    try:
        rx = re.compile(pattern, flags)
    except (re.error, OverflowError, RecursionError) as e:
        raise FileOpError(f"invalid regular expression: {e}", field="pattern") from None
    # A chunk-wide search finds every line a line-by-line search finds (and maybe more, each then
    # checked on its own line) unless the pattern can tell a line's end from a newline.
    wide = None if re.search(LINE_BOUND, pattern) else re.compile(pattern, flags | re.MULTILINE)
    real = _resolve(ws, path, must_exist=True)
    name_rx = _glob_regex(_syntax(glob_pattern, "glob")) if glob_pattern else None
    return in_child(lambda: _grep(ws, real, rx, wide, name_rx, max_results), timeout, f"grep {pattern!r}")


class _Found:
    """A grep's reply as it fills: ``max_results`` bounds matches and binary matches together."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.matches: list[dict[str, Any]] = []
        self.binary: list[str] = []
        self.skipped: list[dict[str, str]] = []
        self.truncated = False

    def room(self) -> bool:
        if len(self.matches) + len(self.binary) < self.limit:
            return True
        self.truncated = True
        return False

    def skip(self, rel: str, reason: str) -> None:
        if len(self.skipped) < MAX_SKIPPED:
            self.skipped.append({"path": rel, "reason": reason})

    def reply(self, names: paths.Skipped) -> dict[str, Any]:
        out: dict[str, Any] = {"matches": self.matches, "truncated": self.truncated}
        if self.binary:
            out["binary_matches"] = self.binary
        if self.skipped:
            out["skipped"] = self.skipped
        return {**out, **names.reply()}


def _grep(ws: str, real: str, rx: re.Pattern[str], wide: re.Pattern[str] | None,
          name_rx: re.Pattern[str] | None, max_results: int) -> dict[str, Any]:
    names = paths.Skipped()
    found = _Found(max_results)
    if not os.path.isdir(real):  # the file named: not a regular one, or unreadable, is an error
        rel = paths.relative(ws, real)
        if not name_rx or name_rx.fullmatch(rel) or name_rx.fullmatch(os.path.basename(rel)):
            with os.fdopen(fileops.open_regular(real, rel), "rb") as fh:
                try:
                    _search_file(fh, rel, rx, wide, found)
                except OSError as e:
                    raise fileops._os_error(e, rel) from None
        return found.reply(names)
    for f in _walk(ws, real, names):
        rel = paths.relative(ws, f)
        try:
            mode = os.lstat(f).st_mode
        except OSError:
            continue  # removed while walked
        if stat.S_ISDIR(mode) or stat.S_ISLNK(mode):
            continue  # directories are walked; symlinks are not followed
        if name_rx and not (name_rx.fullmatch(rel) or name_rx.fullmatch(os.path.basename(rel))):
            continue
        if not stat.S_ISREG(mode):
            found.skip(rel, "not_regular")
            continue
        try:
            fd = fileops.open_regular(f, rel)  # swapped for a FIFO since the walk: skipped, not waited on
        except FileOpError as e:
            found.skip(rel, "not_regular" if "kind" in e.details else "unreadable")
            continue
        try:
            with os.fdopen(fd, "rb") as fh:
                _search_file(fh, rel, rx, wide, found)
        except OSError:
            found.skip(rel, "unreadable")
        if found.truncated:
            break
    return found.reply(names)


def _search_file(fh: Any, rel: str, rx: re.Pattern[str], wide: re.Pattern[str] | None, found: _Found) -> None:
    binary = b"\x00" in fh.read(fileops.SNIFF_BYTES)
    fh.seek(0)
    lines = _Lines(fh)
    for first, text in lines:
        for n, line in _matching(text, first, rx, wide):
            if not found.room():
                return
            if binary:
                found.binary.append(rel)  # its lines are not text: one entry, as GNU grep's
                return
            found.matches.append({"path": rel, "line_number": n, "line": line[:MAX_LINE_CHARS]})
    if lines.long:
        found.skip(rel, "long_line")


def _matching(text: str, first: int, rx: re.Pattern[str], wide: re.Pattern[str] | None) -> Iterator[tuple[int, str]]:
    """(number, line) of each line of ``text`` (lines numbered from ``first``) that ``rx`` matches."""
    if wide is None:
        for i, line in enumerate(text.split("\n")):
            if rx.search(line):
                yield first + i, line
        return
    pos = counted = 0
    n = first
    while pos <= len(text):
        m = wide.search(text, pos)
        if m is None:
            return
        start = text.rfind("\n", 0, m.start()) + 1
        end = text.find("\n", m.start())
        end = len(text) if end < 0 else end
        n += text.count("\n", counted, start)
        counted = start
        line = text[start:end]
        if rx.search(line):
            yield n, line
        pos = end + 1


class _Lines:
    """A file's text a chunk of whole lines at a time: ``(number of its first line, text)``, lines
    split by ``\n`` (a ``\r`` before it dropped), undecodable bytes as U+FFFD. A line longer
    than ``LINE_PIECE`` bytes comes in pieces with the same number (``long`` is then set)."""

    def __init__(self, fh: Any) -> None:
        self.fh = fh
        self.long = False

    def __iter__(self) -> Iterator[tuple[int, str]]:
        n = 1
        rest = b""
        while True:
            chunk = self.fh.read(fileops.CHUNK)
            if not chunk:
                break
            data = rest + chunk if rest else chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                while len(rest) >= LINE_PIECE:
                    self.long = True
                    yield n, _text(rest[:LINE_PIECE])
                    rest = rest[LINE_PIECE:]
                continue
            text = _text(data[:cut])
            if text.endswith("\r"):  # the \r of the \r\n the cut fell on
                text = text[:-1]
            rest = data[cut + 1:]
            yield n, text
            n += text.count("\n") + 1
        if rest:
            yield n, _text(rest)


def _text(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace")
    return text.replace("\r\n", "\n") if "\r" in text else text


def in_child(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    """``fn()``'s JSON value, computed in a forked child killed after ``timeout`` seconds."""
    r, w = os.pipe()  # both close-on-exec
    pid = procs.fork(what, (r, w))
    if pid == 0:  # pragma: no cover - the child; measured through the parent's answers
        _child(fn, r, w)
    os.close(w)
    buf = bytearray()
    timed_out = False
    try:
        poller = select.poll()
        poller.register(r, select.POLLIN)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                timed_out = True
                break
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            buf += chunk
    finally:
        os.close(r)
        if timed_out:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    if timed_out:
        raise FileOpError(f"{what} took longer than {timeout:g} s and was stopped; narrow the pattern or"
                          " the path", status=408, code="SB005", timeout=timeout)
    try:
        reply = loads(bytes(buf).decode())
    except ValueError:
        raise FileOpError(f"{what} failed: its worker ended without an answer (out of memory?)", status=503,
                          code="SB009") from None
    if "error" in reply:
        message, status, code, details = reply["error"]
        raise FileOpError(message, status=status, code=code, **details)
    return reply["value"]


def _child(fn: Callable[[], Any], r: int, w: int) -> None:  # pragma: no cover - runs in the child
    try:
        os.close(r)
        signal.set_wakeup_fd(-1)  # a signal here must not wake the agent's loop
        procs.die_with_parent()
        try:
            reply: dict[str, Any] = {"value": fn()}
        except FileOpError as e:
            reply = {"error": [str(e), e.status, e.code, e.details]}
        except MemoryError:
            reply = {"error": ["search ran out of memory", 413, "SB002", {}]}
        except Exception as e:  # noqa: BLE001 - an answer, never a traceback
            reply = {"error": [f"search failed: {type(e).__name__}", 503, "SB009", {}]}
        view = memoryview(dumps(reply).encode())
        while view:
            view = view[os.write(w, view):]
    finally:
        os._exit(0)
