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
import time

from . import fileops, paths, procs
from .fileops import FileOpError, _resolve, _syntax, _walk
from .lean import dumps, loads, signal

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    import re
    from collections.abc import Callable
    from typing import Any

SEARCH_TIMEOUT = 30.0
MAX_GREP_FILE_BYTES = 8 * 1024 * 1024


def time_limit(requested: Any) -> float:
    """The request's ``timeout`` (seconds, tests and callers that want less), capped."""
    if requested is None:
        return SEARCH_TIMEOUT
    if isinstance(requested, bool) or not isinstance(requested, (int, float)) or not requested > 0:
        raise FileOpError("timeout must be a positive number of seconds", field="timeout")
    return min(float(requested), SEARCH_TIMEOUT)


def glob(ws: str, pattern: str, max_results: int = 1000, timeout: float = SEARCH_TIMEOUT) -> dict[str, Any]:
    """The ``files.glob`` reply: workspace-relative ``paths`` that match (``**`` spans
    directories), and ``skipped_names`` when names not valid UTF-8 were left out."""
    pat = _syntax(pattern, "pattern") if pattern not in ("", ".") else "*"
    regex = _glob_regex(pat)
    root = os.path.realpath(ws)

    def search() -> dict[str, Any]:
        out = []
        skipped = paths.Skipped()
        for real in _walk(ws, root, skipped):
            rel = os.path.relpath(real, root)
            if regex.fullmatch(rel):
                out.append(rel)
                if len(out) >= max_results:
                    break
        return {"paths": out, **skipped.reply()}

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
    """Regex search over regular text files; binary, oversized and special files are skipped."""
    if not isinstance(pattern, str) or not pattern:
        raise FileOpError("pattern must be a non-empty string", field="pattern")
    import re  # noqa: PLC0415 - lazily, as in _glob_regex

    try:
        rx = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except (re.error, OverflowError, RecursionError) as e:
        raise FileOpError(f"invalid regular expression: {e}", field="pattern") from None
    real = _resolve(ws, path, must_exist=True)
    name_rx = _glob_regex(_syntax(glob_pattern, "glob")) if glob_pattern else None
    return in_child(lambda: _grep(ws, real, rx, name_rx, max_results), timeout, f"grep {pattern!r}")


def _grep(ws: str, real: str, rx: re.Pattern[str], name_rx: re.Pattern[str] | None,
          max_results: int) -> dict[str, Any]:
    skipped = paths.Skipped()
    files = [real] if os.path.isfile(real) else [p for p in _walk(ws, real, skipped) if os.path.isfile(p)]
    matches: list[dict[str, Any]] = []
    truncated = False
    for f in files:
        rel = paths.relative(ws, f)
        if os.path.islink(f):
            continue
        if name_rx and not (name_rx.fullmatch(rel) or name_rx.fullmatch(os.path.basename(rel))):
            continue
        try:
            fd = fileops.open_regular(f, rel)  # swapped for a FIFO since the walk: skipped, not waited on
        except FileOpError:
            continue
        try:
            with os.fdopen(fd, "rb") as fh:
                if os.fstat(fh.fileno()).st_size > MAX_GREP_FILE_BYTES:
                    continue
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
    return {"matches": matches, "truncated": truncated, **skipped.reply()}


def in_child(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    """``fn()``'s JSON value, computed in a forked child killed after ``timeout`` seconds."""
    r, w = os.pipe()  # both close-on-exec
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        raise FileOpError(f"cannot run {what}: the box has no room for another process", status=503,
                          code="SB009") from None
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
