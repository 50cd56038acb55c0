"""Background processes of the HTTP API: started in a session's box, followed by this replica.

A background process is one of the in-box agent's background processes (``agent/background.py``,
reached through ``providers/agent_procs.py``): it holds neither the session nor the agent, so runs,
file operations and other processes go on beside it. The replica that owns the session keeps one
record per process (``BgProcess``) and one follower thread (``follower.py``, shared with the E2B
facade) that polls the agent for output into a per-stream buffer; clients read that buffer from
byte offsets (``read``) and may long-poll for new output (``wait_change``).

Memory is bounded: a stream holds at most ``HOLD`` bytes the client has not acknowledged (an
offset sent with a read acknowledges what lies before it), less when its tenant runs many
processes (a fair share of the tenant's budget), and all held output fits the replica's
``Budget`` (follower.py: in all and per tenant); past that the follower stops taking output, which
stays in the box, where the agent pauses the job once 8 MiB wait (a full pipe's back-pressure).
A tenant runs at most ``tenant_max_background_processes`` at once (429 SB008). When the deadline
passes the follower kills the whole job (SIGKILL to its process tree) and the process ends as
``timed_out``. Its end is audited like a run (``RunService.record``; it was filed as started, so
a replica that dies meanwhile leaves an ``interrupted`` row). Ended processes stay readable (exit
status and unread output) while their box lives, the last ``KEEP_ENDED`` per session, for
``KEEP_ENDED_SECONDS``, but only the last ``background_ended_tail_bytes`` of each stream's unread
output are kept (at once when no client read it lately, else after ``READER_GRACE``); reads say
how much was dropped (``stdout_dropped``), and their ``*_skipped`` count it too.

Processes outlive the service that started them when their box does (a Docker container is left
running at a restart and re-attached; another replica takes a session over). The first time this
replica deals with a session's box (``adopt``, before any listing, read or start there) it asks
the agent for its processes (``proc.list``) and follows each one this API started (``proc.start``
was given ``start_meta``, which the agent keeps and lists verbatim) as if it had started it: same
pid, command, cwd, start time, timeout and stdin, its output from the first byte the box still
holds (what the box already freed is counted as dropped), counted against the tenant's cap.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import SandboxError
from ..providers.base import SandboxProvider
from .bg_follower import HttpFollower
from .bg_stream import Stream as _Stream
from .bg_stream import partial_utf8 as _partial_utf8  # noqa: F401 - re-exported
from .config import ServiceSettings
from .executions import RunService, RunSpec
from .follower import Budget

log = logging.getLogger("execbox.service.background")

HOLD = 1024 * 1024  # unacknowledged bytes kept per stream
READ_CHUNK = 1024 * 1024  # bytes of each stream one read returns at most
KEEP_ENDED = 64
KEEP_ENDED_SECONDS = 3600.0
READER_GRACE = 65.0
"""Seconds a client that read a process lately (a long-poll waits at most 60 s) keeps all its
unread output after the end, before only the tail is kept."""
RELIEVE_EVERY = 1.0
OPERATION = "background_command"
SIGNALS = ("SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
"""What the agent delivers (agent/background.py SIGNALS)."""
META_API = "http"
"""``meta.api`` of the processes this API starts (the E2B facade's carry none): only those are adopted."""
ADOPT_WAIT = 35.0
"""Seconds a request waits for another one's adoption of the same box (longer than one agent call)."""
ADOPT_MAX = 64
"""Processes adopted from one box at most (the agent runs at most 64)."""
BOXES_KEPT = 4096
"""Boxes remembered as adopted; past it the oldest is forgotten (its next request lists it again)."""
_AUDIT_KEY = re.compile(r"[0-9a-f]{32}")


def no_call(*_: Any) -> Any:
    """The ``call`` of a process's RunSpec: a process request runs no code."""
    raise AssertionError("a process request runs no code")


def start_meta(tenant_id: str, session_id: str, cwd: str | None, stdin: bool, timeout: float | None,
               started_at: float, audit_key: str | None) -> dict[str, Any]:
    """What ``proc.start`` leaves with the agent for a later service to adopt the process by
    (returned verbatim by ``proc.list``; the agent bounds it at 8 KiB as JSON)."""
    return {"api": META_API, "tenant": tenant_id, "session": session_id, "cwd": cwd, "stdin": bool(stdin),
            "timeout": timeout, "started_at": started_at, "audit": audit_key}


def supports(provider: SandboxProvider) -> bool:
    return bool(getattr(provider, "supports_background_processes", False))


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
    stdin_closed: bool = False  # a request closed its stdin (``stdin`` is False then, as when started without)
    error: str | None = None
    ended_at: float | None = None
    version: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = field(default_factory=list)
    budget: Budget | None = None  # what its held output is booked on (ProcessTable.add sets it)
    charged: int = 0  # bytes booked on the budget
    forgotten: bool = False  # out of the table: holds nothing more
    last_read: float = 0.0  # time.monotonic() of the last read (0: never)
    trimmed: bool = False  # ended, and only the tail of its unread output kept
    adopted: bool = False  # started by an earlier service (or replica) and adopted from the box's agent
    over_cap: bool = False  # adopted while its tenant ran as many as it may: not counted (``ProcessTable._over``)
    promoted: bool = False  # adopted over the cap, counted since a place freed: the table lets it leave
    box_sizes: tuple[int, int] | None = None
    """Final sizes of stdout and stderr once the box reported the process over (the agent's poll
    ``ended``) while this replica has not taken all its output yet: it is not ``ended`` here until
    then, but it is no longer running (review 32, F7)."""

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
        """The process's state. ``running`` stays true until its output has all been taken from the box
        (its exit status comes with the last of it); before that, once the box reported it over, it
        says ``exited_in_box: true`` and the streams' final sizes (``stdout_size``, ``stderr_size``)."""
        with self.cond:
            out = {"pid": self.pid, "command": self.command, "cwd": self.cwd, "running": not self.ended,
                   "status": self.status, "exit_code": self.exit_code, "signal": self.signal,
                   "timed_out": self.timed_out, "error": self.error, "stdin": self.stdin and not self.ended,
                   "timeout": self.timeout, "started_at": self.started_at, "ended_at": self.ended_at}
            if self.box_sizes is not None and not self.ended:
                out.update(exited_in_box=True, stdout_size=self.box_sizes[0], stderr_size=self.box_sizes[1])
            if self.adopted:
                out["adopted"] = True
                if self.over_cap:
                    out["over_tenant_cap"] = True
            return out

    def saw_poll(self, poll: dict[str, Any]) -> None:
        """Note what the agent's poll says of the end: over in the box, with its streams' final sizes."""
        if poll.get("ended") and "stdout_size" in poll:
            with self.cond:
                if self.box_sizes is None and not self.ended:
                    self.box_sizes = (int(poll["stdout_size"]), int(poll.get("stderr_size") or 0))

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
            self.last_read = time.monotonic()
            self.out.ack(out_offset)
            self.err.ack(err_offset)
            self.settle()
            self.cond.notify_all()  # the follower may take more output now
            out, out_from, out_skip = self.out.take(out_offset, limit, self.ended)
            err, err_from, err_skip = self.err.take(err_offset, limit, self.ended)
            return {"stdout": out, "stderr": err, "stdout_offset": max(out_offset, out_from + len(out)),
                    "stderr_offset": max(err_offset, err_from + len(err)), "stdout_skipped": out_skip,
                    "stderr_skipped": err_skip, "stdout_dropped": self.out.dropped,
                    "stderr_dropped": self.err.dropped, "version": self.version}

    # -- what it holds (call with ``cond`` held) ---------------------------------------------------
    @property
    def held(self) -> int:
        return len(self.out.buf) + len(self.err.buf)

    def settle(self) -> None:
        """Book what the buffers hold now on the budget."""
        if self.forgotten:
            self.out.buf.clear()
            self.err.buf.clear()
        if self.budget is not None:
            self.budget.charge(self.tenant_id, self.held - self.charged)
        self.charged = self.held

    def reader_active(self, now: float) -> bool:
        """A client reads it: one waits, or one read within ``READER_GRACE``."""
        return bool(self.waiters) or (self.last_read > 0 and now - self.last_read < READER_GRACE)

    def keep_tail(self, keep: int, again: bool = False) -> None:
        """Ended: keep only the last ``keep`` bytes of each stream's unread output (once, unless ``again``)."""
        if self.ended and (again or not self.trimmed):
            self.trimmed = True
            self.out.keep_tail(keep)
            self.err.keep_tail(keep)
            self.settle()
            self.changed()

    def forget(self) -> None:
        """Out of the table: free its output."""
        with self.cond:
            self.forgotten = True
            self.settle()

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
    """This replica's background processes, per session, and their followers, and the budget of
    what they hold (shared with the E2B facade's processes)."""

    def __init__(self, runs: RunService, max_per_session: int, settings: ServiceSettings | None = None) -> None:
        self.runs = runs
        self.max_per_session = max_per_session
        if settings is None:  # the session manager's (routes and MCP pass only the per-session cap)
            found = getattr(getattr(runs, "sessions", None), "settings", None)
            settings = found if isinstance(found, ServiceSettings) else ServiceSettings()
        self.budget = Budget.from_settings(settings)
        self.tail = settings.background_ended_tail_bytes
        self._lock = threading.Lock()
        self._procs: dict[tuple[str, str], dict[int, BgProcess]] = {}
        self._relieved = 0.0
        self._boxes: dict[tuple[str, str, str], threading.Event] = {}  # boxes adopted (set: done)
        self._over: dict[str, list[BgProcess]] = {}  # adopted past the tenant's cap, not counted yet

    def of_box(self, tenant_id: str, session_id: str, instance_id: str) -> list[BgProcess]:
        """The session's processes in its current box (those of an earlier box are forgotten)."""
        key = (tenant_id, session_id)
        now = time.time()
        gone: list[BgProcess] = []
        with self._lock:
            table = self._procs.get(key, {})
            for pid, p in list(table.items()):
                stale = p.ended and p.ended_at is not None and now - p.ended_at > KEEP_ENDED_SECONDS
                if p.instance_id != instance_id or stale:
                    gone.append(table.pop(pid))
            ended = sorted((p for p in table.values() if p.ended), key=lambda p: p.ended_at or 0)
            for p in ended[:max(0, len(ended) - KEEP_ENDED)]:
                gone.append(table.pop(p.pid))
            if not table:
                self._procs.pop(key, None)
            procs = sorted(table.values(), key=lambda p: p.started_at)
        for p in gone:
            p.forget()
        self.trim(procs)
        return procs

    def get(self, tenant_id: str, session_id: str, instance_id: str, pid: int) -> BgProcess | None:
        return next((p for p in self.of_box(tenant_id, session_id, instance_id) if p.pid == pid), None)

    def running(self, tenant_id: str, session_id: str, instance_id: str) -> int:
        """Processes running in the session's box. Raises SB008 (429) first when the tenant runs
        as many as it may (``tenant_max_background_processes``), adopted ones over the cap
        included: a start checks this."""
        self._promote(tenant_id)  # whatever still waits for a place holds the budget at its cap
        self.budget.check(tenant_id)
        return sum(1 for p in self.of_box(tenant_id, session_id, instance_id) if not p.ended)

    def add(self, proc: BgProcess, spec: RunSpec) -> None:
        """Track and follow a process just started; SB008 (429, the process killed) when its
        tenant already runs as many as it may (a start that raced another)."""
        try:
            self.budget.admit(proc.tenant_id)
        except SandboxError as e:
            try:
                proc.provider.signal_process(proc.instance_id, proc.pid, "SIGKILL")
            except SandboxError:
                pass
            self.runs.record(spec, proc.provider.name, proc.instance_id, proc.started_mono, "error", None, e.code)
            raise
        proc.budget = self.budget
        self.sweep()
        with self._lock:
            table = self._procs.setdefault((proc.tenant_id, proc.session_id), {})
            old = table.get(proc.pid)
            table[proc.pid] = proc  # a reused pid: the new one
        if old is not None:
            old.forget()
        self._follow(proc, spec, counted=True)

    def _follow(self, proc: BgProcess, spec: RunSpec, counted: bool) -> None:
        follower = HttpFollower(self, proc, spec)
        if counted:  # it leaves the budget when it ends (an uncounted adoptee: ``finished``)
            follower.budget, follower.tenant = self.budget, proc.tenant_id
        follower.start(f"execbox-proc-{proc.pid}")

    # -- adoption ------------------------------------------------------------------------------
    def adopt(self, provider: SandboxProvider, tenant_id: str, session_id: str, instance_id: str) -> None:
        """The first time this replica deals with the session's box: track and follow the
        processes an earlier service (this replica before a restart, or the session's previous
        owner) started there through this API and the box still runs or has not reported ended.
        Later calls for the box return at once (a concurrent one waits for the first). A box
        that cannot be listed now is listed again at the next request. The adopted ones are
        counted against ``tenant_max_background_processes``; those past it are adopted anyway
        (said by ``over_tenant_cap`` and a warning) and keep new starts refused until enough end."""
        key = (tenant_id, session_id, instance_id)
        with self._lock:
            done = self._boxes.get(key)
            mine = done is None
            if done is None:
                for other in [k for k in self._boxes if k[:2] == key[:2]]:
                    del self._boxes[other]  # the session's earlier box
                while len(self._boxes) >= BOXES_KEPT:
                    del self._boxes[next(iter(self._boxes))]
                done = self._boxes[key] = threading.Event()
        if not mine:
            done.wait(ADOPT_WAIT)
            return
        try:
            listing = getattr(provider, "list_processes", None)
            entries = listing(instance_id) if supports(provider) and listing is not None else []
        except Exception as e:  # noqa: BLE001 - the request goes on; its own agent call says what is wrong
            log.warning("listing the processes of box %s of session %s/%s failed: %s", instance_id,
                        tenant_id, session_id, e)
            with self._lock:
                if self._boxes.get(key) is done:
                    del self._boxes[key]
            done.set()
            return
        try:
            for entry in entries[:ADOPT_MAX]:
                got = self._adoptee(provider, tenant_id, session_id, instance_id, entry)
                if got is not None:
                    self._take_over(*got)
        finally:
            done.set()

    def _adoptee(self, provider: SandboxProvider, tenant_id: str, session_id: str, instance_id: str,
                 entry: Any) -> tuple[BgProcess, RunSpec] | None:
        """The record of one ``proc.list`` entry to adopt, or None: not started through this API
        (the E2B facade's, or listed by an agent that keeps no ``meta``), another session's (never
        adopted: the box is one session's), or not well formed (the box is not trusted)."""
        meta = entry.get("meta") if isinstance(entry, dict) else None
        if not isinstance(meta, dict) or meta.get("api") != META_API:
            return None
        if meta.get("tenant") != tenant_id or meta.get("session") != session_id:
            log.warning("box %s of session %s/%s lists process %r of another session; not adopted",
                        instance_id, tenant_id, session_id, entry.get("pid"))
            return None
        try:
            pid, command = int(entry["pid"]), str(entry["command"])
            started_at = float(meta.get("started_at") or entry.get("started") or time.time())
            timeout = None if meta.get("timeout") is None else float(meta["timeout"])
            firsts = max(0, int(entry.get("stdout_from") or 0)), max(0, int(entry.get("stderr_from") or 0))
        except (KeyError, TypeError, ValueError):
            return None
        cwd = meta.get("cwd") if isinstance(meta.get("cwd"), str) else None
        now, mono = time.time(), time.monotonic()
        proc = BgProcess(pid, command, cwd, tenant_id, session_id, provider, instance_id, bool(entry.get("stdin")),
                         timeout, started_at=started_at, started_mono=mono - max(0.0, now - started_at),
                         adopted=True)
        proc.stdin_closed = bool(meta.get("stdin")) and not proc.stdin  # an earlier request closed it
        for stream, first in ((proc.out, firsts[0]), (proc.err, firsts[1])):
            stream.base = stream.dropped = first  # freed by the box once an earlier service took it
        audit = meta.get("audit")
        spec = RunSpec(tenant_id, session_id, OPERATION, "bash", command, None, no_call,
                       inflight=audit if isinstance(audit, str) and _AUDIT_KEY.fullmatch(audit) else None)
        return proc, spec

    def _take_over(self, proc: BgProcess, spec: RunSpec) -> None:
        """Track and follow an adopted process, unless this replica follows it already. One it
        tracks as ended is replaced: the box still lists it, so this replica lost it (a box it let
        go of and took back) or the pid was reused."""
        tenant = proc.tenant_id
        try:
            self.budget.admit(tenant)
            counted = True
        except SandboxError:
            counted = False
        with self._lock:
            table = self._procs.setdefault((tenant, proc.session_id), {})
            old = table.get(proc.pid)
            known = old is not None and not old.ended
            if not known:
                table[proc.pid] = proc
                proc.budget = self.budget
                if not counted:
                    proc.over_cap = True
                    self._over.setdefault(tenant, []).append(proc)
        if known:
            if counted:
                self.budget.leave(tenant)
            return
        if old is not None:
            old.forget()
        if not counted:
            log.warning("tenant %s runs more background processes than it may (%d) with process %d adopted "
                        "from session %s; new ones are refused until enough end", tenant,
                        self.budget.tenant_max_processes, proc.pid, proc.session_id)
        self._follow(proc, spec, counted)

    def finished(self, proc: BgProcess, lost: bool = False) -> None:
        """A followed process ended (before its readers hear of it): an adoptee past the cap
        frees its place in the queue, one counted since leaves the budget, and the next waiting
        adoptee of the tenant may be counted. ``lost`` (following it failed): the next request
        for its box lists the box again (what it still runs is adopted anew)."""
        with self._lock:
            if lost:
                self._boxes.pop((proc.tenant_id, proc.session_id, proc.instance_id), None)
            over = self._over.get(proc.tenant_id, [])
            if proc in over:
                over.remove(proc)
                proc.over_cap = False
                if not over:
                    self._over.pop(proc.tenant_id, None)
            elif proc.promoted:
                proc.promoted = False
                self.budget.leave(proc.tenant_id)
        self._promote(proc.tenant_id)

    def _promote(self, tenant_id: str) -> None:
        """Count adoptees that were past the tenant's cap, as far as the cap now allows."""
        with self._lock:
            over = self._over.get(tenant_id)
            while over:
                try:
                    self.budget.admit(tenant_id)
                except SandboxError:
                    break
                p = over.pop(0)
                p.over_cap, p.promoted = False, True
            if over is not None and not over:
                self._over.pop(tenant_id, None)

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
        for _, p in gone:
            p.forget()
        self.trim([p for _, p in ended])

    def trim(self, procs: list[BgProcess]) -> None:
        """Keep only the tail of the unread output of those that ended (no reader lately, or
        ``READER_GRACE`` ago)."""
        now, wall = time.monotonic(), time.time()
        for p in procs:
            with p.cond:
                if p.ended and not p.trimmed and (not p.reader_active(now) or
                                                  wall - (p.ended_at or wall) > READER_GRACE):
                    p.keep_tail(self.tail)

    def relieve(self, tenant_id: str) -> None:
        """A follower of ``tenant_id`` waits for room (at most every ``RELIEVE_EVERY``): trim what
        may be trimmed, then drop the unread tails of ended processes nobody reads, oldest first
        (of the tenant when its own budget is spent), until a quarter of its budget is free."""
        now = time.monotonic()
        with self._lock:
            if now - self._relieved < RELIEVE_EVERY:
                return
            self._relieved = now
            ended = [p for table in self._procs.values() for p in table.values() if p.ended]
        self.trim([p for p in ended if not p.trimmed])
        budget = self.budget
        want = max(1, budget.tenant_hold_bytes // 4)
        own = budget.held(tenant_id) + want > budget.tenant_hold_bytes
        for p in sorted(ended, key=lambda p: p.ended_at or 0):
            if budget.room(tenant_id) >= want:
                break
            if own and p.tenant_id != tenant_id:
                continue
            with p.cond:
                if p.held and not p.reader_active(now):
                    p.keep_tail(0, again=True)

    def stream_hold(self, tenant_id: str) -> int:
        """Unacknowledged bytes one stream may hold: ``HOLD``, or its share of the tenant's budget."""
        return self.budget.share(tenant_id, HOLD)

    def tracked(self, proc: BgProcess) -> bool:
        with self._lock:
            return self._procs.get((proc.tenant_id, proc.session_id), {}).get(proc.pid) is proc
