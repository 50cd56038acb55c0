"""envd's process service (Connect RPC, process.Process).

On agent-backed providers a started process is one of the agent's background processes
(``envd_bg``): it runs beside run_code, file operations and other processes, takes stdin
(SendInput, StreamInput, CloseStdin) and signals, and its pid is its pid in the box. On other
providers it is one streamed ``run_command`` through the service's RunService (quota slot,
metrics, audit) holding the session, without stdin or PTY. Output events fan out to the Start
stream and to any Connect stream. A PTY process runs behind the agent's pty relay; its output is
sent as pty data, SendInput's stdin/pty bytes are its terminal input and Update resizes it.

Pids (``ProcTable``). A process is known by its pid in the box, except when that pid was already
handed out in the sandbox: a box that dies is replaced by a fresh pid namespace whose first
processes get the same small pids as the dead box's (review 38, F3). The sandbox remembers the
pids of its last ``ENDED_KEPT`` ended processes (those lost with their box included) for its life,
and a new process whose box pid is one of them, or one of a running process, gets an alias above
the kernel's pid range (``bg_adopt.ALIAS_BASE`` + n, as the HTTP API's table does), so a pid never
names two processes: Connect, SendSignal, SendInput, StreamInput, CloseStdin and Update on an
ended pid answer NOT_FOUND, as envd does for a process it no longer runs (the SDKs: `kill` returns
False, `connect` raises NotFoundException), and List shows running processes only. Every agent
call uses the box pid (``Proc.box_pid``).

A stream that does not keep up holds the process's output back, as envd's fan-out does: the
follower takes no more while the slowest stream has ``envd_bg.SUBSCRIBER_HOLD`` bytes queued, and
what the queues hold is booked on the replica's budget of held output (``follower.Budget``); the
output waits in the box meanwhile. A stream that ends (the client went away) stops counting.
"""

from __future__ import annotations

import contextvars
import itertools
import shlex
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from protobuf import Oneof

from ...errors import SandboxError
from ...models import ExecutionResult
from ...providers.base import OutputCallback, SandboxProvider
from ..bg_adopt import ALIAS_BASE, MAX_ID, box_alive
from ..executions import RunSpec
from . import envd_bg
from .envd_bg import Proc, Subscription
from .envd_gen.process import process_pb as pb
from .registry import E2BSandbox, Registry
from .workspace import PathRefused, to_workspace

if TYPE_CHECKING:  # pragma: no cover
    from ..container import Services

_SHELLS = {"/bin/bash", "bash", "/bin/sh", "sh", "/usr/bin/bash"}
_pids = itertools.count(1000)

_STATUS_CODES = {400: Code.INVALID_ARGUMENT, 401: Code.UNAUTHENTICATED, 403: Code.PERMISSION_DENIED,
                 404: Code.NOT_FOUND, 408: Code.DEADLINE_EXCEEDED, 409: Code.ALREADY_EXISTS,
                 413: Code.RESOURCE_EXHAUSTED, 429: Code.RESOURCE_EXHAUSTED, 501: Code.UNIMPLEMENTED,
                 503: Code.UNAVAILABLE, 504: Code.DEADLINE_EXCEEDED, 507: Code.RESOURCE_EXHAUSTED}


def connect_error(e: SandboxError) -> ConnectError:
    return ConnectError(_STATUS_CODES.get(e.http_status, Code.INTERNAL), f"{e.code}: {e.message}")


def sandbox_for(reg: Registry, ctx: Any) -> E2BSandbox:
    """The sandbox the (already authenticated) request addresses."""
    sb = reg.get(ctx.request_headers.get("e2b-sandbox-id") or "")
    if sb is None:
        raise ConnectError(Code.NOT_FOUND, "sandbox not found")
    return sb


def shell_command(cfg: pb.ProcessConfig) -> str:
    """The command line run_command runs. E2B sends `/bin/bash -l -c CMD`: CMD is used as given;
    any other argv is quoted word by word, never interpolated."""
    args = list(cfg.args)
    if cfg.cmd in _SHELLS and len(args) >= 2 and args[-2] == "-c" and all(a.startswith("-") for a in args[:-1]):
        return args[-1]
    return shlex.join([cfg.cmd, *args])


ENDED_KEPT = 256
"""Pids of ended processes a sandbox remembers (the last ones): a new process whose box pid is one
of them gets an alias."""
_tables_lock = threading.Lock()


class ProcTable:
    """A sandbox's envd processes by public pid: those not yet forgotten (running, or ending), and
    the pids of the last ``ENDED_KEPT`` that ended, which no later process is given."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, Proc] = {}
        self._ended: OrderedDict[int, None] = OrderedDict()
        self._alias = ALIAS_BASE

    def add(self, box_pid: int, make: Callable[[int], Proc]) -> Proc:
        """Put in the process ``make(public pid)`` that has ``box_pid`` in the box (or that id)."""
        with self._lock:
            pid = box_pid
            if pid in self._live or pid in self._ended:
                pid = self._alias + 1
                while pid > MAX_ID or pid in self._live or pid in self._ended:
                    pid = ALIAS_BASE + 1 if pid > MAX_ID else pid + 1  # two billion aliases: count again
                self._alias = pid
            proc = make(pid)
            self._live[pid] = proc
            return proc

    def ended(self, proc: Proc) -> None:
        """``proc`` ended (or was lost with its box): forgotten, its pid remembered."""
        with self._lock:
            if self._live.get(proc.pid) is proc:
                del self._live[proc.pid]
            self._ended[proc.pid] = None
            self._ended.move_to_end(proc.pid)
            while len(self._ended) > ENDED_KEPT:
                self._ended.popitem(last=False)

    def running(self) -> list[Proc]:
        with self._lock:
            return [p for p in self._live.values() if not p.done]

    def find(self, selector: pb.ProcessSelector | None) -> Proc:
        """The running process ``selector`` names; NOT_FOUND, as envd answers, for any other."""
        sel = selector.selector if selector is not None else None
        if sel is not None and sel.field == "pid":
            with self._lock:
                proc, ended = self._live.get(sel.value), sel.value in self._ended
            if proc is not None and not proc.done:
                return proc
            raise ConnectError(Code.NOT_FOUND, f"process with pid {sel.value} not found"
                               + (" (it ended)" if ended or proc is not None else ""))
        if sel is not None and sel.field == "tag":
            for p in self.running():
                if p.tag == sel.value:
                    return p
            raise ConnectError(Code.NOT_FOUND, f"process with tag {sel.value} not found")
        raise ConnectError(Code.INVALID_ARGUMENT, "a process selector (pid or tag) is required")


def procs_of(sb: E2BSandbox) -> ProcTable:
    """The sandbox's process table (for its life on this replica)."""
    table = getattr(sb, "_procs", None)
    if table is None:
        with _tables_lock:
            table = getattr(sb, "_procs", None)
            if table is None:
                table = sb._procs = ProcTable()  # type: ignore[attr-defined]
    return table


def _data(stream: str, text: str) -> pb.ProcessEvent:
    return pb.ProcessEvent(event=Oneof("data", pb.ProcessEvent.DataEvent(output=Oneof(stream, text.encode()))))


def _end(result: ExecutionResult | None, error: str | None) -> pb.ProcessEvent:
    if result is None:
        end = pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status="error", error=error)
    elif result.timed_out:
        end = pb.ProcessEvent.EndEvent(exit_code=result.exit_code or -1, exited=False, status="timeout",
                                       error="command timed out")
    elif result.metadata.get("cancelled") or result.exit_code < 0:
        end = pb.ProcessEvent.EndEvent(exit_code=result.exit_code if result.exit_code else -9, exited=False,
                                       status="signal: killed", error="killed")
    else:
        end = pb.ProcessEvent.EndEvent(exit_code=result.exit_code, exited=True,
                                       status=f"exit status {result.exit_code}")
    return pb.ProcessEvent(event=Oneof("end", end))


async def _relay(pid: int, events: Subscription, response: Any) -> AsyncIterator[Any]:
    """A Start or Connect stream: the start event, then the process's events to its end, each as
    ``response``; a client that goes away unsubscribes (its queue would otherwise hold output)."""
    try:
        yield response(event=pb.ProcessEvent(event=Oneof("start", pb.ProcessEvent.StartEvent(pid=pid))))
        while (event := await events.get()) is not None:
            yield response(event=event)
    finally:
        events.close()


class ProcessService:
    def __init__(self, services: Services) -> None:
        self.svc = services

    @property
    def reg(self) -> Registry:
        return self.svc.e2b

    async def list(self, request: pb.ListRequest, ctx: Any) -> pb.ListResponse:
        sb = sandbox_for(self.reg, ctx)
        return pb.ListResponse(processes=[p.info() for p in procs_of(sb).running()])

    def _find(self, sb: E2BSandbox, selector: pb.ProcessSelector | None) -> Proc:
        return procs_of(sb).find(selector)

    def _reserve(self, sb: E2BSandbox) -> None:
        """Count one more process starting in ``sb``; RESOURCE_EXHAUSTED (SB008) at the cap.
        Called on the event loop with no await between the count and the reservation."""
        cap = self.svc.settings.max_background_processes
        starting = getattr(sb, "_starting", 0)
        running = len(procs_of(sb).running())
        if running + starting >= cap:
            raise ConnectError(Code.RESOURCE_EXHAUSTED,
                               f"SB008: too many processes running in this sandbox (max {cap}, "
                               f"SANDBOX_MAX_BACKGROUND_PROCESSES); wait for or kill one first")
        sb._starting = starting + 1  # type: ignore[attr-defined]

    async def start(self, request: pb.StartRequest, ctx: Any):  # noqa: ANN201
        sb = sandbox_for(self.reg, ctx)
        self._reserve(sb)
        try:
            pid, events = await self._launch(sb, request, ctx)
        finally:
            sb._starting -= 1  # type: ignore[attr-defined]
        async for response in _relay(pid, events, pb.StartResponse):
            yield response

    async def _launch(self, sb: E2BSandbox, request: pb.StartRequest, ctx: Any) -> tuple[int, Subscription]:
        """Start the process (in procs_of once this returns): its public pid and its event queue."""
        cfg = request.process or pb.ProcessConfig()
        try:
            cwd = to_workspace(cfg.cwd) if cfg.cwd else None
        except PathRefused as e:
            raise ConnectError(Code.INVALID_ARGUMENT, str(e)) from None
        command = shell_command(cfg)
        env = {**sb.env_vars, **dict(cfg.envs)}
        timeout = max(1.0, min(sb.end_at - time.time(), (ctx.timeout_ms or 3_600_000) / 1000))
        try:
            provider, instance_id = await anyio.to_thread.run_sync(envd_bg.resolve_box, self.svc, sb)
        except SandboxError as e:
            raise connect_error(e) from None
        pty = None
        if request.pty is not None:
            size = request.pty.size
            pty = (size.cols if size else 80, size.rows if size else 24)
        if getattr(provider, "supports_background_processes", False):
            stdin = request.stdin is None or bool(request.stdin)  # unset means on (older SDKs)
            budget = envd_bg.budget_of(self.svc)
            try:
                budget.admit(sb.tenant_id)  # the tenant's cap on running processes (left when it ends)
            except SandboxError as e:
                raise connect_error(e) from None
            try:
                box_pid = await anyio.to_thread.run_sync(lambda: provider.start_process(
                    instance_id, command, cwd=None if cwd in (None, ".") else cwd, env=env, stdin=stdin, pty=pty))
            except BaseException as e:
                budget.leave(sb.tenant_id)
                if isinstance(e, SandboxError):
                    raise connect_error(e) from None
                raise
            table = procs_of(sb)
            bg = table.add(box_pid, lambda pid: Proc(
                pid, cfg, request.tag, provider, instance_id, background=True, pty=pty is not None,
                stdin=stdin or pty is not None, budget=budget, tenant=sb.tenant_id, box_pid=box_pid))
            events = bg.subscribe()
            spec = RunSpec(sb.tenant_id, sb.session_id, "run_command", "bash", command, sb.token_id, None)  # type: ignore[arg-type]
            envd_bg.start_follower(self.svc, sb, bg, time.monotonic() + timeout, spec, lambda: table.ended(bg))
            return bg.pid, events
        if pty is not None:
            raise ConnectError(Code.UNIMPLEMENTED, "PTY needs an agent-backed provider (jail, Docker, Kubernetes)")
        table = procs_of(sb)
        proc = table.add(next(_pids), lambda pid: Proc(pid, cfg, request.tag))
        queue = proc.subscribe()

        def call(provider: SandboxProvider, instance_id: str, one_shot: bool,
                 out: OutputCallback | None) -> ExecutionResult:
            proc.provider, proc.instance_id = provider, instance_id
            return provider.run_command(instance_id, command, timeout, cwd=None if cwd == "." else cwd,
                                        env=env or None, on_output=out)

        def on_output(stream: str, text: str) -> None:
            if stream in ("stdout", "stderr") and text:
                proc.publish(_data(stream, text))

        def work() -> None:
            result, error = None, None
            try:
                spec = RunSpec(sb.tenant_id, sb.session_id, "run_command", "bash", command, sb.token_id, call)
                result = self.svc.runs.run(spec, on_output)
            except SandboxError as e:
                error = f"{e.code}: {e.message}"
            except Exception as e:  # noqa: BLE001 - reported in the end event; the server stays up
                error = str(e)
            proc.publish(_end(result, error))
            proc.publish(None)
            table.ended(proc)

        # on the request's context: what the request set there (sessions.notes) holds for the run
        threading.Thread(target=contextvars.copy_context().run, args=(work,), name=f"execbox-e2b-proc-{proc.pid}",
                         daemon=True).start()
        return proc.pid, queue

    async def connect(self, request: pb.ConnectRequest, ctx: Any):  # noqa: ANN201
        sb = sandbox_for(self.reg, ctx)
        proc = self._find(sb, request.process)
        async for response in _relay(proc.pid, proc.subscribe(), pb.ConnectResponse):
            yield response

    async def send_signal(self, request: pb.SendSignalRequest, ctx: Any) -> pb.SendSignalResponse:
        sb = sandbox_for(self.reg, ctx)
        proc = self._find(sb, request.process)
        if proc.background:
            await self._bg(proc, "signal_process", envd_bg.signal_name(request.signal.value))
        elif proc.provider is not None and proc.instance_id is not None:
            proc.provider.cancel(proc.instance_id)  # SIGTERM and SIGKILL both end the run's process tree
        return pb.SendSignalResponse()

    async def _bg(self, proc: Proc, method: str, *args: Any) -> Any:
        """One background-process request to the process's box (never through the session)."""
        if not proc.background:
            raise ConnectError(Code.UNIMPLEMENTED, "stdin is not supported by this sandbox's provider")
        fn = getattr(proc.provider, method)
        try:
            return await anyio.to_thread.run_sync(lambda: fn(proc.instance_id, proc.box_pid, *args))
        except SandboxError as e:
            if not await anyio.to_thread.run_sync(_box_alive, proc):  # its box died; the follower will see it
                raise ConnectError(Code.NOT_FOUND, f"process with pid {proc.pid} not found (its box ended)") from None
            raise connect_error(e) from None

    async def _input(self, proc: Proc, data: bytes) -> None:
        """Write to the process's stdin; FAILED_PRECONDITION when it takes none, as envd answers
        for a process started without stdin or whose stdin was closed."""
        if proc.background and not proc.stdin:
            raise ConnectError(Code.FAILED_PRECONDITION, _no_stdin(proc.pid))
        try:
            await self._bg(proc, "process_input", data)
        except ConnectError as e:
            if e.code == Code.ALREADY_EXISTS:  # the agent's 409: no stdin, or the process closed it
                raise ConnectError(Code.FAILED_PRECONDITION, f"{_no_stdin(proc.pid)} ({e.message})") from None
            raise

    @staticmethod
    def _stdin_bytes(inp: pb.ProcessInput | None) -> bytes:
        sel = inp.input if inp is not None else None
        if sel is None:
            return b""
        return bytes(sel.value)  # stdin or pty bytes: a PTY process's stdin is its terminal

    async def update(self, request: pb.UpdateRequest, ctx: Any) -> pb.UpdateResponse:
        proc = self._find(sandbox_for(self.reg, ctx), request.process)
        size = request.pty.size if request.pty is not None else None
        if size is not None:
            if not proc.pty:
                raise ConnectError(Code.FAILED_PRECONDITION, "the process has no terminal")
            await self._bg(proc, "resize_process", size.cols, size.rows)
        return pb.UpdateResponse()

    async def stream_input(self, request: Any, ctx: Any) -> pb.StreamInputResponse:
        sb = sandbox_for(self.reg, ctx)
        proc: Proc | None = None
        async for msg in request:
            event = msg.event
            if event is None or event.field == "keepalive":
                continue
            if event.field == "start":
                proc = self._find(sb, event.value.process)
            elif proc is None:
                raise ConnectError(Code.INVALID_ARGUMENT, "the first StreamInput message must select a process")
            else:
                data = self._stdin_bytes(event.value.input)
                if data:
                    await self._input(proc, data)
        return pb.StreamInputResponse()

    async def send_input(self, request: pb.SendInputRequest, ctx: Any) -> pb.SendInputResponse:
        proc = self._find(sandbox_for(self.reg, ctx), request.process)
        data = self._stdin_bytes(request.input)
        if data:
            await self._input(proc, data)
        return pb.SendInputResponse()

    async def close_stdin(self, request: pb.CloseStdinRequest, ctx: Any) -> pb.CloseStdinResponse:
        proc = self._find(sandbox_for(self.reg, ctx), request.process)
        await self._bg(proc, "close_process_input")
        proc.stdin = False
        return pb.CloseStdinResponse()


def _box_alive(proc: Proc) -> bool:
    return proc.provider is not None and proc.instance_id is not None and box_alive(proc.provider, proc.instance_id)


def _no_stdin(pid: int) -> str:
    return (f"stdin not enabled or closed: process {pid} was started without stdin "
            "(commands.run(..., stdin=True) enables it) or its stdin was closed")
