"""One execution: fork a child from the warm agent, pump its output, enforce time and size caps.

The pump is shared by one-shot children and stateful contexts: it reads stdout/stderr/result
pipes, streams chunks when asked, notices cancellation from the host, and kills the whole tree
when the deadline passes.
"""

from __future__ import annotations

import codecs
import os
import resource
import select
import time

from . import paths, procs
from .lean import b64encode, loads, raw_decode, signal

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

DEFAULT_OUTPUT_CAP = 1024 * 1024
INTERRUPT_GRACE = 2.0  # seconds a context's cell past its time has to end on its interrupt
INTERRUPT_AGAIN = 0.5  # seconds between interrupts within that grace (one may come before the cell)
# The result pipe holds {"result": {"json": <the value's JSON as a JSON string>, ...}}: at most twice
# the value's JSON (each '"' and '\\' escaped once more) plus a little framing. Past this bound the
# value is surely over the cap, and only RESULT_TAIL bytes are kept: where a Python child's exit
# record is (write_exit_record).
RESULT_SLACK = 64 * 1024
RESULT_TAIL = 4096
INLINE_ARTIFACT_CAP = 16 * 1024 * 1024
MAX_ARTIFACTS = 200
DRAIN_GRACE = 0.2
OOM_MARKERS = ("JavaScript heap out of memory", "Cannot allocate memory", "std::bad_alloc",
               "_ArrayMemoryError: Unable to allocate")
# A failed allocation is a bare ``MemoryError``; ``raise MemoryError("cache budget exceeded")``
# is the program's own error, not the box running out of memory.
BARE_MEMORY_ERROR = "MemoryError"


class Stream:
    # A plain class, not a dataclass: importing dataclasses pulls in inspect, tokenize and dis,
    # several ms of every box start (the agent's imports are on the box's start-up path).
    __slots__ = ("name", "fd", "cap", "emit", "data", "truncated", "decoder")

    def __init__(self, name: str, fd: int, cap: int, emit: Callable[[str, str], None] | None) -> None:
        self.name, self.fd, self.cap, self.emit = name, fd, cap, emit
        self.data = bytearray()
        self.truncated = False
        self.decoder: Any = None

    def feed(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        if len(chunk) > room:
            self.truncated = True
        if self.emit is not None and room > 0:
            if self.decoder is None:
                self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
            text = self.decoder.decode(chunk[: max(room, 0)])
            if text:
                self.emit(self.name, text)

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


class Watch:
    """What the pump waits on: the process to watch and how to learn it finished."""

    __slots__ = ("pid", "is_done", "extra_fds", "on_extra", "persistent", "finished")

    def __init__(self, pid: int, is_done: Callable[[], dict[str, Any] | None],
                 extra_fds: list[int] | None = None, on_extra: Callable[[int], None] | None = None,
                 persistent: bool = False, finished: Callable[[bytes], dict[str, Any] | None] | None = None) -> None:
        self.pid = pid
        self.is_done = is_done  # returns the exit info once finished
        # Once every pipe is at EOF: the exit info from the result pipe's exit record, if any
        # (the reply then need not wait for the process's exit and reap).
        self.finished = finished
        self.extra_fds = extra_fds if extra_fds is not None else []  # e.g. a context's control socket
        self.on_extra = on_extra
        self.persistent = persistent  # the output pipes outlive the run (a JS context): drain, no EOF wait


def snapshot(directory: str) -> dict[str, tuple[int, int]]:
    """(mtime_ns, size) of each regular file under ``directory``, hidden directories and symlinks
    left out. A loop, not ``os.walk``, which recurses once per level before Python 3.12: code that
    made ``artifacts/`` ~1000 levels deep made every later run of its session fail with
    RecursionError. What cannot be read (gone, a path too long) is left out."""
    out: dict[str, tuple[int, int]] = {}
    if not os.path.isdir(directory):
        return out
    stack = [directory]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = list(it)
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if not entry.name.startswith("."):
                        stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    out[os.path.relpath(entry.path, directory)] = (st.st_mtime_ns, st.st_size)
            except OSError:
                continue
    return out


def collect_artifacts(directory: str, before: dict[str, tuple[int, int]], ws_rel: str,
                      inline: bool) -> tuple[list[dict[str, Any]], int]:
    """The files a run made or changed under ``directory``, and how many of them were left out
    because their names are not valid UTF-8 (no reply could carry them)."""
    after = snapshot(directory)
    skipped = paths.Skipped()
    changed = sorted(skipped.keep([k for k, v in after.items() if before.get(k) != v]))[:MAX_ARTIFACTS]
    out: list[dict[str, Any]] = []
    if not changed:
        return out, skipped.count
    import hashlib  # noqa: PLC0415 - only when a run wrote files: off the box's start-up path
    import mimetypes  # noqa: PLC0415

    budget = INLINE_ARTIFACT_CAP
    for rel in changed:
        path = os.path.join(directory, rel)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                data = f.read()
        except OSError:
            continue
        item = {
            "name": rel,
            "path": f"{ws_rel}/{rel}",
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "mime_type": mimetypes.guess_type(rel)[0] or "application/octet-stream",
        }
        if inline and len(data) <= budget:
            item["content_b64"] = b64encode(data).decode()
            budget -= len(data)
        out.append(item)
    return out, skipped.count


def skipped_artifacts_note(count: int) -> str:
    """The stderr line for artifacts left out by ``collect_artifacts`` ("" for none)."""
    if not count:
        return ""
    return (f"execbox: {count} new or changed file(s) in artifacts/ not returned as artifacts: "
            "their names are not valid UTF-8; rename them to UTF-8 names to get them back\n")


def pump(
    watch: Watch,
    streams: list[Stream],
    result_fd: int,
    deadline: float,
    wake_fd: int,
    control_fd: int | None,
    on_control: Callable[[bytes], bool],
    on_wake: Callable[[], None],
    kill: Callable[[], None],
    cancelled: bool = False,
    result_cap: int | None = None,
) -> dict[str, Any]:
    """Run the IO loop until the watched process is done and its pipes are drained.

    ``on_control`` gets bytes from the host and returns True when they cancel this run;
    ``cancelled`` says a cancel came before the loop started (read together with the request).
    ``result_cap`` (the output cap) bounds what is kept of the result pipe, as Stream caps stdout:
    past ``2 * result_cap + RESULT_SLACK`` bytes only a tail is kept and ``result_overflow`` is set.
    """
    result_limit = None if result_cap is None else 2 * result_cap + RESULT_SLACK
    result_overflow = False
    result_bytes = 0
    # epoll itself rather than selectors (whose import, with the collections it pulls in, costs
    # ~2 ms of every box start). Not poll(2): epoll reports fds in the order they became ready, so
    # stderr written before stdout is read first. A hang-up is reported whatever was asked for
    # (its read returns EOF).
    with select.epoll() as poller:
        by_fd = {s.fd: s for s in streams}
        result_buf = bytearray()
        open_fds = {s.fd for s in streams} | {result_fd}
        for fd in (*by_fd, result_fd, wake_fd, *([] if control_fd is None else [control_fd]), *watch.extra_fds):
            poller.register(fd, select.EPOLLIN)
        timed_out = False
        done: dict[str, Any] | None = watch.is_done()
        if cancelled and done is None:
            kill()
        drain_until: float | None = None
        while True:
            now = time.monotonic()
            if done is not None and drain_until is None:
                drain_until = now + DRAIN_GRACE
            if done is None and not timed_out and not cancelled and now >= deadline:
                timed_out = True
                kill()
            if done is not None and watch.persistent:
                _drain_now(streams, by_fd, open_fds)
                break
            if done is not None and (not open_fds or now >= drain_until):
                break
            if done is None and (timed_out or cancelled) and now >= deadline + 5:
                break  # the process will not die: give up waiting, report what we have
            wait = (drain_until - now) if drain_until else (deadline - now if not (timed_out or cancelled) else 0.05)
            for fd, _ in poller.poll(max(0.0, min(wait, 1.0))):
                if fd in by_fd or fd == result_fd:
                    try:
                        chunk = os.read(fd, 65536)
                    except OSError:
                        chunk = b""
                    if not chunk:
                        poller.unregister(fd)
                        open_fds.discard(fd)
                    elif fd == result_fd:
                        result_bytes += len(chunk)
                        result_buf += chunk
                        if result_limit is not None and (result_overflow or len(result_buf) > result_limit):
                            result_overflow = True
                            del result_buf[:-RESULT_TAIL]
                    else:
                        by_fd[fd].feed(chunk)
                elif fd == wake_fd:
                    try:
                        os.read(wake_fd, 4096)
                    except OSError:
                        pass
                    on_wake()
                elif fd == control_fd:
                    try:
                        data = os.read(control_fd, 1 << 20)
                    except OSError:
                        data = b""
                    if on_control(data) and not cancelled and done is None:
                        cancelled = True
                        kill()
                elif watch.on_extra is not None:
                    watch.on_extra(fd)
            if done is None:
                done = watch.is_done()
            if done is None and not open_fds and watch.finished is not None:
                done = watch.finished(bytes(result_buf))
    # the epoll object is closed; the caller closes every fd it created
    exit_info = done or {"exit_code": -signal.SIGKILL, "signal": signal.SIGKILL}
    return {
        "timed_out": timed_out,
        "cancelled": cancelled,
        "result_raw": bytes(result_buf),
        "result_overflow": result_overflow,
        "result_bytes": result_bytes,
        "exit": exit_info,
    }


def _drain_now(streams: list[Stream], by_fd: dict[int, Stream], open_fds: set[int]) -> None:
    """Read what is already buffered in non-blocking pipes that stay open after the run."""
    for s in streams:
        while s.fd in open_fds:
            try:
                chunk = os.read(s.fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                open_fds.discard(s.fd)
                break
            by_fd[s.fd].feed(chunk)


EXIT_RECORD = b'{"exited":'


def write_exit_record(res_w: int, code: int) -> None:
    """The last thing a Python run's child does: report its exit, then close every pipe.

    ``exit_record`` on the agent's side reads it once all pipes are at EOF; the child's own
    exit (and its reap) then no longer delays the reply. Peak memory counts the child and the
    children it waited for, as wait4 would report it.
    """
    maxrss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                 resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    os.write(res_w, EXIT_RECORD + b"%d,\"maxrss\":%d}" % (code, maxrss))
    for fd in (res_w, 1, 2):
        try:
            os.close(fd)
        except OSError:
            pass


def exit_record(raw: bytes) -> dict[str, Any] | None:
    """The exit info from a result stream that ends with ``write_exit_record``'s record."""
    at = raw.rfind(EXIT_RECORD)
    if at < 0:
        return None
    try:
        rec = loads(raw[at:])
        code, maxrss = rec["exited"], rec["maxrss"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(code, int) or not isinstance(maxrss, int) or isinstance(code, bool):
        return None
    return {"exit_code": code, "signal": None, "peak_memory_kb": maxrss}


ERROR_TEXT_CAP = 16 * 1024
"""Characters of a run's ``error`` value and of its traceback, each (runners.py and js_common.js
clip to it where they write the record): the whole traceback is on stderr, under the output cap,
and the record stays far below the result pipe's slack (RESULT_SLACK), never pushing a value out."""
ERROR_KEYS = ("name", "value", "traceback")


def clip_text(text: str, cap: int = ERROR_TEXT_CAP) -> str:
    """``text`` within ``cap`` characters: its head and tail (a traceback's last line names the error)."""
    if len(text) <= cap:
        return text
    half = max(cap // 2 - 32, 0)
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters cut] ...\n{text[len(text) - half:]}"


def error_record(obj: Any, cap: int = ERROR_TEXT_CAP) -> dict[str, str] | None:
    """A run's ``{name, value, traceback}`` as the runner wrote it, each a string within ``cap``;
    None for anything else (user code can write to the result fd too: it only misreports its own run)."""
    if not isinstance(obj, dict) or not all(isinstance(obj.get(k), str) for k in ERROR_KEYS):
        return None
    return {"name": obj["name"][:200], "value": clip_text(obj["value"], cap),
            "traceback": clip_text(obj["traceback"], cap)}


def parse_result(raw: bytes) -> tuple[dict[str, Any] | None, bool, list[str] | None, dict[str, str] | None]:
    """(result dict or None, oom flag, the threads a finished Python program was waiting for or
    None, the exception that ended the user's code as ``{name, value, traceback}`` or None) from
    the records the runner wrote to the result fd. The first error counts: it ended the code (a
    JavaScript callback's uncaught error may follow the program's own)."""
    result = None
    oom = False
    waits = None
    error = None
    if raw:
        text = raw.decode("utf-8", errors="replace")
        idx = 0
        while idx < len(text):
            try:
                obj, end = raw_decode(text, idx)
            except ValueError:
                break
            idx = end
            if isinstance(obj, dict):
                if "result" in obj:
                    result = obj["result"]
                if obj.get("oom"):
                    oom = True
                names = obj.get("exit_waits_for")  # runners.EXIT_WAITS
                if isinstance(names, list):
                    waits = [str(n)[:100] for n in names][:10]
                if error is None and "error" in obj:
                    error = error_record(obj["error"])
    return result, oom, waits, error


def cap_result(result: dict[str, Any] | None, cap: int, overflow: bool = False,
               size: int = 0) -> tuple[dict[str, Any] | None, str]:
    """Drop a ``main()`` value whose JSON is over ``cap`` bytes (the output cap stdout and stderr
    have), as a stream past its cap is cut: ``(result, note)`` where the result becomes
    ``{"present": false, "truncated": true, "json_bytes": n, "type": t}`` and ``note`` is the line
    for stderr ("" when the value fits). ``overflow``: the pump already cut the result pipe (``size``
    bytes arrived), so the value is over the cap whatever the kept bytes say."""
    if overflow:
        n, kind = size, None
    elif result and result.get("present") and isinstance(result.get("json"), str):
        n = len(result["json"].encode("utf-8", errors="replace"))
        if n <= cap:
            return result, ""
        kind = result.get("type")
    else:
        return result, ""
    about = f"about {n}" if overflow else str(n)
    note = (f"execbox: the value main() returned is {about} bytes as JSON, over the output cap of {cap} "
            "bytes; it was dropped (result is null, truncated is true)\n")
    return {"present": False, "truncated": True, "json_bytes": n, "type": kind}, note


def looks_oom(stderr: str, exit_info: dict[str, Any]) -> bool:
    if exit_info.get("exit_code", 0) == 0:
        return False
    tail = stderr[-4096:]
    return any(m in tail for m in OOM_MARKERS) or BARE_MEMORY_ERROR in tail.splitlines()


def kill_quietly(pid: int, keep: set[int] | None = None) -> None:
    try:
        procs.kill_tree(pid, keep=keep)
    except Exception:  # noqa: BLE001
        pass


class Interrupt:
    """A notebook's interrupt of a context's cell past its time, or cancelled: SIGINT now and
    again every INTERRUPT_AGAIN (one may come before the cell runs: a context ignores it between
    cells), and a kill of the context once INTERRUPT_GRACE passes without the cell's answer."""

    __slots__ = ("pid", "keep", "since", "resent")

    def __init__(self, pid: int, keep: Callable[[], set[int]]) -> None:
        self.pid, self.keep = pid, keep
        self.since: float | None = None
        self.resent = 0.0

    @property
    def pending(self) -> bool:
        """Sent, and the context not killed for ignoring it: an answer now means the cell ended."""
        return self.since is not None

    def start(self) -> None:
        self.since, self.resent = time.monotonic(), 0.0
        self._signal()

    def tick(self) -> None:
        """From the watch's is_done: the repeat, or the kill once the grace is over."""
        if self.since is None:
            return
        waited = time.monotonic() - self.since
        if waited >= INTERRUPT_GRACE:
            self.since = None
            kill_quietly(self.pid, keep=self.keep())
        elif waited >= self.resent + INTERRUPT_AGAIN:
            self.resent = waited
            self._signal()

    def _signal(self) -> None:
        try:
            os.kill(self.pid, signal.SIGINT)
        except OSError:
            pass
