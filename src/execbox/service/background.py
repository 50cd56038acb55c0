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
status and unread output) while their session lives, the last ``KEEP_ENDED`` per session, for
``KEEP_ENDED_SECONDS``, but only the last ``background_ended_tail_bytes`` of each stream's unread
output are kept (at once when no client read it lately, else after ``READER_GRACE``); reads say
how much was dropped (``stdout_dropped``), and their ``*_skipped`` count it too.

When a session's box ends under its processes (it died, was stopped for a pause, or replaced),
they are kept as ended, ``lost`` with an ``error`` saying so (a tombstone), under the same rules
as other ended processes, so a client that polls one learns what became of it, while its session
lives on this replica (a new session of the name is another: ``_incarnation``). Processes an
earlier service left in a live box are adopted (``bg_adopt.py``, with the public ids: ``pid`` is
the pid in the box unless another id of the session's table holds it, ``box_pid`` always is).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..errors import SandboxError
from ..providers.base import SandboxProvider
from .bg_adopt import (  # noqa: F401 - re-exported
    ADOPT_MAX,
    ADOPT_WAIT,
    ALIAS_BASE,
    BOX_ENDED,
    BOXES_KEPT,
    META_API,
    OPERATION,
    ProcessAdoption,
    box_alive,
    no_call,
    public_id,
    start_meta,
    supports,
)
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
SIGNALS = ("SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
"""What the agent delivers (agent/background.py SIGNALS)."""


@dataclass(eq=False)
class BgProcess:
    pid: int
    """The id clients know it by: ``box_pid``, or an alias (bg_adopt.py) while the session's table
    holds another process under that number; ``ProcessTable.add`` sets it."""
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
    counted: bool = False  # holds a place in the tenant's count: ``ProcessTable.finished`` frees it, once
    box_pid: int = 0
    """Its pid in the box, which every agent call names (0 when made: ``pid``)."""
    session: Any = None
    """The life of its session it belongs to (``ProcessTable._incarnation``): a session closed and
    made again under the name is another, whose table starts empty."""
    box_sizes: tuple[int, int] | None = None
    """Final sizes of stdout and stderr once the box reported the process over (the agent's poll
    ``ended``) while this replica has not taken all its output yet: it is not ``ended`` here until
    then, but it is no longer running (review 32, F7)."""

    def __post_init__(self) -> None:
        if not self.box_pid:
            self.box_pid = self.pid

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
            out = {"pid": self.pid, "box_pid": self.box_pid, "command": self.command, "cwd": self.cwd,
                   "running": not self.ended, "status": self.status, "exit_code": self.exit_code, "signal": self.signal,
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


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class ProcessTable(ProcessAdoption):
    """This replica's background processes, per session, and their followers, and the budget of
    what they hold (shared with the E2B facade's processes). Adoption, public ids and places
    under the tenant's cap: ``ProcessAdoption`` (bg_adopt.py)."""

    def __init__(self, runs: RunService, max_per_session: int, settings: ServiceSettings | None = None) -> None:
        self.runs = runs
        self.max_per_session = max_per_session
        sessions = getattr(runs, "sessions", None)
        if settings is None:  # the session manager's (routes and MCP pass only the per-session cap)
            found = getattr(sessions, "settings", None)
            settings = found if isinstance(found, ServiceSettings) else ServiceSettings()
        self._sessions = sessions if callable(getattr(sessions, "get", None)) else None
        self.budget = Budget.from_settings(settings)
        self.tail = settings.background_ended_tail_bytes
        self._lock = threading.Lock()
        self._procs: dict[tuple[str, str], dict[int, BgProcess]] = {}  # by public id
        self._relieved = 0.0
        self._boxes: dict[tuple[str, str, str], threading.Event] = {}  # boxes adopted (set: done)
        self._over: dict[str, list[BgProcess]] = {}  # adopted past the tenant's cap, not counted yet
        self._aliases: OrderedDict[tuple[str, str], int] = OrderedDict()  # the last alias per session

    def of_box(self, tenant_id: str, session_id: str, instance_id: str) -> list[BgProcess]:
        """The session's processes: those in its current box, and those of its earlier boxes,
        ended (``lost`` when the box ended under them). Those of an earlier life of the session
        (closed and made again) are forgotten."""
        key = (tenant_id, session_id)
        life = self._incarnation(tenant_id, session_id)
        with self._lock:
            table = self._procs.get(key, {})
            lost = [p for p in table.values() if p.instance_id != instance_id and p.session is life and not p.ended]
        for p in lost:
            self.lose(p, BOX_ENDED)
        now = time.time()
        gone: list[BgProcess] = []
        with self._lock:
            table = self._procs.get(key, {})
            for pid, p in list(table.items()):
                stale = p.ended and p.ended_at is not None and now - p.ended_at > KEEP_ENDED_SECONDS
                if stale or (p.instance_id != instance_id and p.session is not life):
                    gone.append(table.pop(pid))
                elif p.instance_id == instance_id:
                    p.session = life  # in the session's box: its (a box taken back is the same one)
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
        """The session's process whose public id is ``pid``."""
        return next((p for p in self.of_box(tenant_id, session_id, instance_id) if p.pid == pid), None)

    def running(self, tenant_id: str, session_id: str, instance_id: str) -> int:
        """Processes running in the session's box. Raises SB008 (429) first when the tenant runs
        as many as it may (``tenant_max_background_processes``), adopted ones over the cap
        included: a start checks this."""
        self._promote(tenant_id)  # whatever still waits for a place holds the budget at its cap
        self.budget.check(tenant_id)
        return sum(1 for p in self.of_box(tenant_id, session_id, instance_id) if not p.ended)

    def add(self, proc: BgProcess, spec: RunSpec, plan: dict[str, Any] | None = None) -> None:
        """Track and follow a process just started (``plan``: the ``id_plan`` its start was given:
        its public id is the alias there when its pid is taken); SB008 (429, the process killed)
        when its tenant already runs as many as it may (a start that raced another)."""
        try:
            self.budget.admit(proc.tenant_id)
        except SandboxError as e:
            try:
                proc.provider.signal_process(proc.instance_id, proc.box_pid, "SIGKILL")
            except SandboxError:
                pass
            self.runs.record(spec, proc.provider.name, proc.instance_id, proc.started_mono, "error", None, e.code)
            raise
        proc.pid = public_id(proc.box_pid, plan)
        proc.budget, proc.counted = self.budget, True
        proc.session = self._incarnation(proc.tenant_id, proc.session_id)
        self.sweep()
        with self._lock:
            table = self._procs.setdefault((proc.tenant_id, proc.session_id), {})
            old = table.get(proc.pid)
            table[proc.pid] = proc  # an id the plan did not know was taken (none should be): the new one
        if old is not None:
            self.lose(old, BOX_ENDED)
            old.forget()
        self._follow(proc, spec)

    def _follow(self, proc: BgProcess, spec: RunSpec) -> None:
        HttpFollower(self, proc, spec).start(f"execbox-proc-{proc.pid}")

    def sweep(self) -> None:
        """Forget ended processes that ended long ago, or whose box is gone with their session
        (it ended, or is another life of the name now), with their unread output, whichever
        session they were in. One whose box is gone while its session lives is kept (``lost``)."""
        now = time.time()
        with self._lock:
            ended = [(key, p) for key, table in self._procs.items() for p in table.values() if p.ended]
        gone = [(key, p) for key, p in ended
                if now - (p.ended_at or now) > KEEP_ENDED_SECONDS
                or (p.session is not self._incarnation(*key) and not box_alive(p.provider, p.instance_id))]
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
