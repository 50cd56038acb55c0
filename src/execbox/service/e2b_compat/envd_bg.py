"""envd processes as the agent's background processes: start, follow (poll), stdin, signal.

Used for every provider with ``supports_background_processes`` (all agent-backed ones). The
process runs in the box on its own; it holds neither the session nor the agent, so run_code,
files and other commands go on beside it. One follower thread per process (``service/follower.py``,
shared with the HTTP API; idle polls here back off to 50 ms, and to 1 s after 10 s of quiet)
fans its output out to every Start / Connect stream (``Proc``, ``Subscription``); when the
deadline (the SDK's request timeout, at most the sandbox's end) passes, it kills the process's
whole job. Clients know a process by its public pid (``Proc.pid``), the agent by its pid in the
box (``Proc.box_pid``); they differ when the box pid was already handed out in the sandbox
(``envd_process.ProcTable``).

Memory is bounded as for the HTTP API: the follower takes no more output while the slowest stream
has ``SUBSCRIBER_HOLD`` bytes queued (its share of the tenant's budget when the tenant runs many
processes) or the replica's budget (``follower.Budget``, shared with the HTTP API) is spent; the
output waits in the box meanwhile (back-pressure, as envd's fan-out blocks on a slow consumer),
and the processes a tenant runs at once are capped (RESOURCE_EXHAUSTED, SB008). A process has at
most ``MAX_SUBSCRIBERS`` streams at once (its Start stream and Connect streams): each holds
transport buffers the budget does not see, so a Connect past them is RESOURCE_EXHAUSTED (SB008;
the E2B SDK raises RateLimitException).
"""

from __future__ import annotations

import asyncio
import logging
import signal as signal_module
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from protobuf import Oneof

from ...errors import SessionNotFoundError
from ...providers.base import SandboxProvider
from ..config import ServiceSettings
from ..executions import RunSpec
from ..follower import Budget, Follower
from .envd_gen.process import process_pb as pb

SUBSCRIBER_HOLD = 1024 * 1024
"""Bytes of output queued for the slowest stream past which the follower takes no more."""
MAX_SUBSCRIBERS = 16
"""Streams (Start and Connect) one process has at once."""
_DEFAULT_BUDGET = Budget.from_settings(ServiceSettings())


def budget_of(state: Any) -> Budget:
    """The replica's budget of background output (the HTTP API's process table holds it)."""
    table = getattr(state, "processes", None)
    budget = getattr(table, "budget", None)
    return budget if isinstance(budget, Budget) else _DEFAULT_BUDGET


def resolve_box(state: Any, sb: Any, fresh: bool = False) -> tuple[Any, str]:
    """(provider, instance id) of the sandbox's session, cached on the sandbox.

    The cache lets process requests reach the box while another request holds the session
    (a long run_code); so does ``beside_run`` when nothing is cached yet (the first command of a
    sandbox while a cell runs). A stale entry (box gone) is replaced through the session.
    """
    cached = getattr(sb, "_box", None)
    if cached is not None and not fresh and cached[0].instance_alive(cached[1]):
        return cached
    pair = state.sessions.beside_run(sb.tenant_id, sb.session_id)  # a run holds it: its box, without waiting
    if pair is None:
        with state.sessions.session(sb.tenant_id, sb.session_id) as s:
            pair = (s.provider, s.instance_id)
    sb._box = pair
    return pair


def signal_name(sig: int) -> str:
    return "SIGTERM" if sig == pb.Signal.SIGTERM.value else "SIGKILL"


def signal_description(sig: int) -> str:
    """A signal as envd's status says it (Go's ``syscall.Signal.String()``: "killed", "broken
    pipe", "segmentation fault"), which is the C library's description in lower case."""
    try:
        text = signal_module.strsignal(sig)
    except ValueError:
        text = None
    return text.lower() if text else f"signal {sig}"


def end_event(poll: dict[str, Any] | None, timed_out: bool, error: str | None) -> pb.ProcessEvent:
    if poll is None:
        end = pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status="error", error=error)
    elif timed_out:
        end = pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status="timeout", error="command timed out")
    elif poll.get("signal"):
        name = signal_description(int(poll["signal"]))
        end = pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status=f"signal: {name}", error=name)
    else:
        code = int(poll.get("exit_code", -1))
        end = pb.ProcessEvent.EndEvent(exit_code=code, exited=True, status=f"exit status {code}")
    return pb.ProcessEvent(event=Oneof("end", end))


def _data(stream: str, data: bytes) -> pb.ProcessEvent:
    return pb.ProcessEvent(event=Oneof("data", pb.ProcessEvent.DataEvent(output=Oneof(stream, data))))


class _Follower(Follower):
    """Follows an envd ``Proc``: output is published as data events as it comes, then the end."""

    poll_idle = 0.05
    log = logging.getLogger("execbox.service.e2b")

    def __init__(self, state: Any, proc: Any, deadline: float, spec: RunSpec, forget: Callable[[], None]) -> None:
        box_pid = getattr(proc, "box_pid", None) or proc.pid  # the agent knows it by its pid in the box
        super().__init__(proc.provider, proc.instance_id, box_pid, deadline, state.runs, spec, time.monotonic())
        self.proc, self.forget = proc, forget
        self.out_off = self.err_off = 0

    def offsets(self) -> tuple[int, int, bool]:
        proc = self.proc
        full = False
        if proc.budget is not None:
            hold = proc.budget.share(proc.tenant, SUBSCRIBER_HOLD)
            full = proc.backlog() >= hold or proc.budget.room(proc.tenant) <= 0
        return self.out_off, self.err_off, full

    def take(self, poll: dict[str, Any]) -> None:
        out, err = poll["stdout"], poll["stderr"]
        if not poll.get("exited"):  # as much as the budget has room for; the rest is polled again
            out = out[:self.proc.reserve(len(out))] if out else out
            err = err[:self.proc.reserve(len(err))] if err else err
        if out:
            self.proc.publish(_data("pty" if self.proc.pty else "stdout", out))
            self.out_off += len(out)
        if err:
            self.proc.publish(_data("stderr", err))
            self.err_off += len(err)

    def pause(self, delay: float) -> None:
        self.proc.wait_drained(delay)  # a stream that takes its queue wakes it early

    def lost(self, e: Exception) -> str:
        return "the sandbox was killed" if isinstance(e, SessionNotFoundError) else super().lost(e)

    def ended(self) -> None:
        self.proc.publish(end_event(self.last, self.timed_out, self.error))
        self.proc.publish(None)
        self.forget()


@dataclass
class Proc:
    pid: int  # the public pid (what clients see; envd_process.ProcTable)
    config: pb.ProcessConfig
    tag: str | None
    provider: SandboxProvider | None = None
    instance_id: str | None = None
    background: bool = False  # an agent background process: pid is the box pid
    pty: bool = False  # on a pseudo-terminal: output travels as pty data
    stdin: bool = False  # takes input: started with stdin (or on a terminal) and not closed since
    done: bool = False
    subscribers: list[Subscription] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    budget: Budget | None = None  # books what the queues hold, for tenant
    tenant: str = ""
    charged: int = 0
    drained: threading.Condition = field(default_factory=threading.Condition)
    box_pid: int = 0  # an agent background process's pid in the box (every agent call uses it); 0: ``pid``

    def __post_init__(self) -> None:
        self.box_pid = self.box_pid or self.pid

    def subscribe(self) -> Subscription:
        sub = Subscription(self, asyncio.get_running_loop())
        with self.lock:
            if self.done:
                sub.queue.put_nowait((None, 0))
            elif len(self.subscribers) >= MAX_SUBSCRIBERS:
                raise ConnectError(Code.RESOURCE_EXHAUSTED,
                                   f"SB008: process {self.pid} has {MAX_SUBSCRIBERS} streams connected "
                                   "(the most it may); close one first")
            else:
                self.subscribers.append(sub)
        return sub

    def publish(self, event: pb.ProcessEvent | None) -> None:
        size = _size(event)
        with self.lock:
            if self.done:
                return
            self.done = event is None
            subs = list(self.subscribers)
            for sub in subs:
                sub.queued += size
            self._settle()
        for sub in subs:
            sub.loop.call_soon_threadsafe(sub.queue.put_nowait, (event, size))

    def reserve(self, want: int) -> int:
        """Book up to ``want`` bytes of output on the budget before publishing them: how many fit."""
        if self.budget is None:
            return want
        got = self.budget.take(self.tenant, want)
        with self.lock:
            self.charged += got
        return got

    def backlog(self) -> int:
        """Bytes queued for the slowest stream."""
        with self.lock:
            return max((s.queued for s in self.subscribers), default=0)

    def wait_drained(self, timeout: float) -> None:
        """Until a stream took some of its queue, or ``timeout`` passed."""
        with self.drained:
            self.drained.wait(timeout)

    def _consumed(self, sub: Subscription, size: int, leave: bool = False) -> None:
        with self.lock:
            sub.queued -= size
            if leave and sub in self.subscribers:
                self.subscribers.remove(sub)
            self._settle()
        with self.drained:
            self.drained.notify_all()

    def _settle(self) -> None:  # with lock held: book the slowest queue
        held = max((s.queued for s in self.subscribers), default=0)
        if self.budget is not None:
            self.budget.charge(self.tenant, held - self.charged)
        self.charged = held

    def info(self) -> pb.ProcessInfo:
        return pb.ProcessInfo(config=self.config, pid=self.pid, tag=self.tag)


class Subscription:
    """One Start or Connect stream's queue of events, and the bytes of output queued in it."""

    def __init__(self, proc: Proc, loop: asyncio.AbstractEventLoop) -> None:
        self.proc, self.loop = proc, loop
        self.queue: asyncio.Queue[tuple[pb.ProcessEvent | None, int]] = asyncio.Queue()
        self.queued = 0

    async def get(self) -> pb.ProcessEvent | None:
        event, size = await self.queue.get()
        if size:
            self.proc._consumed(self, size)
        return event

    def close(self) -> None:
        """The stream ended (the end, or its client went away): it no longer holds output back."""
        self.proc._consumed(self, self.queued, leave=True)


def _size(event: pb.ProcessEvent | None) -> int:
    if event is None or event.event is None or event.event.field != "data":
        return 0
    out = event.event.value.output
    return len(out.value) if out is not None else 0


def start_follower(state: Any, sb: Any, proc: Any, deadline: float, spec: RunSpec, forget: Callable[[], None]) -> None:
    """Follow ``proc`` (an envd_process.Proc) in a thread until it ends, then audit it."""
    follower = _Follower(state, proc, deadline, spec, forget)
    follower.budget, follower.tenant = proc.budget, proc.tenant  # admitted at the start: left at the end
    follower.start(f"execbox-e2b-proc-{proc.pid}")
