"""Background processes of the HTTP API: started in a session's box, followed by this replica.

A background process is one of the in-box agent's background processes (``agent/background.py``,
reached through ``providers/agent_procs.py``): it holds neither the session nor the agent, so runs,
file operations and other processes go on beside it. The replica that owns the session keeps one
record per process (``BgProcess``) and one follower thread (``follower.py``, shared with the E2B
facade) that polls the agent for output into a per-stream buffer; clients read that buffer from
byte offsets (``read``) and may long-poll for new output (``wait_change``).

Memory is bounded: a stream holds at most ``HOLD`` bytes the client has not acknowledged (an
offset sent with a read acknowledges what lies before it); past that the follower stops taking
output, which stays in the box, where the agent pauses the job once 8 MiB wait (a full pipe's
back-pressure). When the deadline passes the follower kills the whole job (SIGKILL to its process
tree) and the process ends as ``timed_out``. Its end is audited like a run (``RunService.record``;
it was filed as started, so a replica that dies meanwhile leaves an ``interrupted`` row). Ended
processes stay readable (exit status and unread output) while their box lives, the last
``KEEP_ENDED`` per session, for ``KEEP_ENDED_SECONDS``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import SandboxError
from ..providers.base import SandboxProvider
from .executions import RunService, RunSpec
from .follower import Follower

HOLD = 1024 * 1024  # unacknowledged bytes kept per stream
READ_CHUNK = 1024 * 1024  # bytes of each stream one read returns at most
KEEP_ENDED = 64
KEEP_ENDED_SECONDS = 3600.0
OPERATION = "background_command"
SIGNALS = ("SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
"""What the agent delivers (agent/background.py SIGNALS)."""


def supports(provider: SandboxProvider) -> bool:
    return bool(getattr(provider, "supports_background_processes", False))


class _Stream:
    """Output of one stream: bytes [base, base + len(buf)) are held."""

    __slots__ = ("base", "buf")

    def __init__(self) -> None:
        self.base = 0
        self.buf = bytearray()

    @property
    def end(self) -> int:
        return self.base + len(self.buf)

    def ack(self, offset: int) -> None:
        """Drop what lies before ``offset`` (the client has it)."""
        cut = min(max(0, offset - self.base), len(self.buf))
        if cut:
            del self.buf[:cut]
            self.base += cut

    def take(self, offset: int, limit: int, whole: bool) -> tuple[bytes, int, int]:
        """(data, offset of its first byte, bytes skipped) from ``offset``. ``whole``: the stream
        has ended; otherwise a trailing incomplete UTF-8 sequence is left for the next read."""
        start = max(offset, self.base)
        skipped = start - offset
        data = bytes(self.buf[start - self.base:start - self.base + limit])
        if not whole and start - self.base + len(data) == len(self.buf):
            data = data[:len(data) - _partial_utf8(data)]
        return data, start, skipped


def _partial_utf8(data: bytes) -> int:
    """How many bytes at the end of ``data`` begin a UTF-8 sequence that is not complete yet."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 == 0x80:  # a continuation byte: look further back for the lead
            continue
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return back if need > back else 0
    return 0


@dataclass(eq=False)
class BgProcess:
    pid: int
    command: str
    cwd: str | None
    tenant_id: str
    session_id: str
    provider: SandboxProvider
    instance_id: str
    stdin: bool
    timeout: float | None
    started_at: float = field(default_factory=time.time)
    started_mono: float = field(default_factory=time.monotonic)
    out: _Stream = field(default_factory=_Stream)
    err: _Stream = field(default_factory=_Stream)
    ended: bool = False
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    killed: bool = False
    error: str | None = None
    ended_at: float | None = None
    version: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = field(default_factory=list)

    @property
    def status(self) -> str:
        if not self.ended:
            return "running"
        if self.timed_out:
            return "timed_out"
        if self.error is not None:
            return "lost"
        return "signalled" if self.signal else "exited"

    def info(self) -> dict[str, Any]:
        with self.cond:
            return {"pid": self.pid, "command": self.command, "cwd": self.cwd, "running": not self.ended,
                    "status": self.status, "exit_code": self.exit_code, "signal": self.signal,
                    "timed_out": self.timed_out, "error": self.error, "stdin": self.stdin and not self.ended,
                    "timeout": self.timeout, "started_at": self.started_at, "ended_at": self.ended_at}

    def changed(self) -> None:
        """Call with ``cond`` held: wake readers waiting for output or the end."""
        self.version += 1
        self.cond.notify_all()
        waiters, self.waiters = self.waiters, []
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_settle, fut)

    def read(self, out_offset: int, err_offset: int, limit: int = READ_CHUNK) -> dict[str, Any]:
        """Output past the offsets (acknowledging what lies before them), raw bytes, and the state."""
        with self.cond:
            self.out.ack(out_offset)
            self.err.ack(err_offset)
            self.cond.notify_all()  # the follower may take more output now
            out, out_from, out_skip = self.out.take(out_offset, limit, self.ended)
            err, err_from, err_skip = self.err.take(err_offset, limit, self.ended)
            return {"stdout": out, "stderr": err, "stdout_offset": max(out_offset, out_from + len(out)),
                    "stderr_offset": max(err_offset, err_from + len(err)), "stdout_skipped": out_skip,
                    "stderr_skipped": err_skip, "version": self.version}

    async def wait_change(self, version: int, timeout: float) -> None:
        """Until something changed since ``version`` (new output, the end), or ``timeout`` passed."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self.cond:
            if self.version != version or self.ended:
                return
            self.waiters.append((loop, fut))
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            with self.cond:
                self.waiters = [w for w in self.waiters if w[1] is not fut]


def _alive(provider: SandboxProvider, instance_id: str) -> bool:
    check = getattr(provider, "instance_alive", None)
    try:
        return True if check is None else bool(check(instance_id))
    except Exception:  # noqa: BLE001 - a provider that cannot tell: keep the record for now
        return True


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class ProcessTable:
    """This replica's background processes, per session, and their followers."""

    def __init__(self, runs: RunService, max_per_session: int) -> None:
        self.runs = runs
        self.max_per_session = max_per_session
        self._lock = threading.Lock()
        self._procs: dict[tuple[str, str], dict[int, BgProcess]] = {}

    def of_box(self, tenant_id: str, session_id: str, instance_id: str) -> list[BgProcess]:
        """The session's processes in its current box (those of an earlier box are forgotten)."""
        key = (tenant_id, session_id)
        now = time.time()
        with self._lock:
            table = self._procs.get(key, {})
            for pid, p in list(table.items()):
                stale = p.ended and p.ended_at is not None and now - p.ended_at > KEEP_ENDED_SECONDS
                if p.instance_id != instance_id or stale:
                    del table[pid]
            ended = sorted((p for p in table.values() if p.ended), key=lambda p: p.ended_at or 0)
            for p in ended[:max(0, len(ended) - KEEP_ENDED)]:
                del table[p.pid]
            if not table:
                self._procs.pop(key, None)
            return sorted(table.values(), key=lambda p: p.started_at)

    def get(self, tenant_id: str, session_id: str, instance_id: str, pid: int) -> BgProcess | None:
        return next((p for p in self.of_box(tenant_id, session_id, instance_id) if p.pid == pid), None)

    def running(self, tenant_id: str, session_id: str, instance_id: str) -> int:
        return sum(1 for p in self.of_box(tenant_id, session_id, instance_id) if not p.ended)

    def add(self, proc: BgProcess, spec: RunSpec) -> None:
        self.sweep()
        with self._lock:
            self._procs.setdefault((proc.tenant_id, proc.session_id), {})[proc.pid] = proc  # a reused pid: the new one
        _Follower(self, proc, spec).start(f"execbox-proc-{proc.pid}")

    def sweep(self) -> None:
        """Forget ended processes whose box is gone (their session ended) or that ended long ago,
        with their unread output, whichever session they were in."""
        now = time.time()
        with self._lock:
            ended = [(key, p) for key, table in self._procs.items() for p in table.values() if p.ended]
        gone = [(key, p) for key, p in ended
                if now - (p.ended_at or now) > KEEP_ENDED_SECONDS or not _alive(p.provider, p.instance_id)]
        with self._lock:
            for key, p in gone:
                table = self._procs.get(key, {})
                if table.get(p.pid) is p:
                    del table[p.pid]
                if not table:
                    self._procs.pop(key, None)

    def tracked(self, proc: BgProcess) -> bool:
        with self._lock:
            return self._procs.get((proc.tenant_id, proc.session_id), {}).get(proc.pid) is proc


class _Follower(Follower):
    """Follows a ``BgProcess`` into its buffers: output waits in the box while a stream holds
    ``HOLD`` unacknowledged bytes (a read that frees room wakes the follower early)."""

    def __init__(self, table: ProcessTable, p: BgProcess, spec: RunSpec) -> None:
        deadline = None if p.timeout is None else p.started_mono + p.timeout
        super().__init__(p.provider, p.instance_id, p.pid, deadline, table.runs, spec, p.started_mono)
        self.table, self.p = table, p

    def offsets(self) -> tuple[int, int, bool]:
        p = self.p
        with p.cond:
            return p.out.end, p.err.end, len(p.out.buf) >= HOLD or len(p.err.buf) >= HOLD

    def take(self, poll: dict[str, Any]) -> None:
        p = self.p
        with p.cond:
            p.out.buf += poll["stdout"]
            p.err.buf += poll["stderr"]
            if poll.get("exited"):
                p.exit_code, p.signal = poll.get("exit_code"), poll.get("signal")
                p.ended, p.ended_at = True, time.time()
            if poll["stdout"] or poll["stderr"] or p.ended:
                p.changed()

    def lost(self, e: Exception) -> str:
        if not isinstance(e, SandboxError):
            return f"following the process failed: {type(e).__name__}"
        if e.http_status == 404:
            return f"the box no longer knows process {self.pid}"
        return f"the process was lost with its box ({e.code}: {e.message})"

    def dropped(self) -> str | None:
        return None if self.table.tracked(self.p) else "the session's box changed"

    def expire(self) -> None:
        super().expire()
        with self.p.cond:
            self.p.timed_out = True

    def pause(self, delay: float) -> None:
        with self.p.cond:
            self.p.cond.wait(delay)

    def ended(self) -> None:
        p = self.p
        with p.cond:
            p.error = self.error
            if not p.ended:
                p.ended, p.ended_at = True, time.time()
            p.changed()
        if self.error is not None:
            self.table.sweep()  # its box is likely gone with its session: nothing keeps it readable
