"""Stateful JavaScript contexts: a long-lived Node process per ``context_id`` (js_context.js).

Node cannot receive pipe ends over a unix socket as the Python contexts do, so each JS context
owns its stdout/stderr pipes for life plus a request pipe (fd 3) and a reply pipe (fd 4). An
execution writes one request line and pumps the context's pipes until the reply line arrives
(``pump.Watch.persistent``: the pipes stay open, what is buffered is drained at the end).
A JavaScript cell past its time, or cancelled, is interrupted first as a Python one is, and its
context lives on if the cell ends then; a context killed (one that did not end, a bash one) or
that died is dropped, and the next execution with its id starts from empty globals.
"""

from __future__ import annotations

import os
import select
import time

from . import privsep, procs, pump
from .lean import dumps, loads, signal

TYPE_CHECKING = False  # importing typing costs ~2 ms of every box start; annotations only
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

RESTARTED = "this context was restarted (it timed out or its process ended); earlier state is gone"
JS_CONTEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js_context.js")


class JsContext:
    # A plain class, not a dataclass: the agent's imports are on every box's start-up path.
    __slots__ = ("context_id", "pid", "out_r", "err_r", "req_w", "rep_r", "executions", "reply_buf")

    def __init__(self, context_id: str, pid: int, out_r: int, err_r: int, req_w: int, rep_r: int) -> None:
        self.context_id, self.pid = context_id, pid
        self.out_r, self.err_r, self.req_w, self.rep_r = out_r, err_r, req_w, rep_r
        self.executions = 0
        self.reply_buf = bytearray()

    def fds(self) -> tuple[int, int, int, int]:
        return (self.out_r, self.err_r, self.req_w, self.rep_r)


def fork_exec(agent: Any, fds: Callable[[], list[int]], argv: list[str], env: dict[str, str], cwd: str,
              pipes: tuple[int, ...] = ()) -> int:
    """A context's process: the sandbox user (child_prepare), ``fds()[i]`` as fd i and nothing
    else open, the agent's rlimits, ``argv`` exec'd; its pid. ``fds`` runs in the child;
    ``pipes`` (the caller's, for the child) are closed if the box has no room for it."""
    pid = procs.fork("a context", pipes)
    if pid == 0:
        try:
            agent.child_prepare()
            for sig in privsep.IGNORED_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            wanted = fds()
            # copies first, above 0-2 (always open): a pipe's own number may be one of 0..n
            high = [os.dup(fd) for fd in wanted]
            for dst, src in enumerate(high):
                os.dup2(src, dst)  # dup2 targets are inheritable
            os.closerange(len(wanted), 1024)
            os.chdir(cwd)
            procs.apply_rlimits(agent.limits, allow_address_space=False)
            os.execve(argv[0], argv, env)
        except BaseException:  # noqa: BLE001
            os._exit(127)
    agent.exited.pop(pid, None)  # a reused pid's old status is not this child's
    return pid


def spawn(agent: Any, context_id: str) -> JsContext:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    argv = [agent.node]
    heap = agent.limits.get("memory_bytes")
    if heap:
        argv.append(f"--max-old-space-size={int(heap // (1024 * 1024) * 3 // 4)}")
    pid = fork_exec(agent, lambda: [os.open(os.devnull, os.O_RDONLY), out_w, err_w, req_r, rep_w],
                    [*argv, JS_CONTEXT], dict(os.environ), agent.ws,
                    (out_r, out_w, err_r, err_w, req_r, req_w, rep_r, rep_w))
    for fd in (out_w, err_w, req_r, rep_w):
        os.close(fd)
    for fd in (out_r, err_r, req_w):
        os.set_blocking(fd, False)
    return JsContext(context_id, pid, out_r, err_r, req_w, rep_r)


def close(ctx: JsContext, keep: set[int]) -> None:
    pump.kill_quietly(ctx.pid, keep=keep)
    for fd in ctx.fds():
        try:
            os.close(fd)
        except OSError:
            pass


DIED = {"exit_code": -9, "signal": 9, "died": True}
WRITE_WAIT = 5.0
EXIT_WAIT = 1.0  # seconds to wait for a context whose reply pipe closed to be reapable


def exit_status(agent: Any, ctx: Any) -> dict[str, Any]:
    """How a context whose reply pipe (or socket) closed ended: its real exit status
    (``exit 3``, ``process.exit(3)``, ``os._exit(3)`` is 3; a signal is that signal). One that
    closed the pipe and lives on is killed: DIED."""
    stop = time.monotonic() + EXIT_WAIT
    while True:
        if ctx.pid in agent.exited:
            status, ru = agent.exited.pop(ctx.pid)
            break
        try:
            got, status, ru = os.wait4(ctx.pid, os.WNOHANG)
        except ChildProcessError:
            got, status, ru = 0, 0, None
        if got:
            break
        if time.monotonic() >= stop:
            procs.kill_tree(ctx.pid, keep=agent._keep_pids() - {ctx.pid})
            return DIED
        time.sleep(0.005)
    return procs.died(status, ru)


def _reply(raw: bytes) -> dict[str, Any] | None:
    """A context's reply line as the context writes it, or None for anything else."""
    try:
        msg = loads(raw)
    except ValueError:
        return None
    if not isinstance(msg, dict) or type(msg.get("exit_code")) is not int:
        return None
    if msg.get("result") is not None and not isinstance(msg["result"], dict):
        return None
    if not isinstance(msg.get("peak_memory_kb"), (int, type(None))):
        msg["peak_memory_kb"] = None
    return msg


def _exit_code_of(head: bytes) -> int:
    """The exit code at the start of a reply line cut for its size (``{"exit_code":N,...``)."""
    prefix = b'{"exit_code":'
    if not head.startswith(prefix):
        return 1
    digits = head[len(prefix):].split(b",", 1)[0]
    try:
        return int(digits)
    except ValueError:
        return 1


def start(agent: Any, ctx: JsContext, request: bytes, deadline: float, result_cap: int = pump.DEFAULT_OUTPUT_CAP,
          note: dict[str, Any] | None = None):
    """Send one cell (``request``, written whole to the context's request pipe by ``deadline``);
    the Watch is done when the reply line (or EOF: the context died, exit_status says how) arrives.

    With ``note`` (a JavaScript context), the cell past its time or cancelled is interrupted first
    (pump.Interrupt; js_context.js ends it, its globals kept) and ``context_interrupted`` is
    noted when it answers; without it (bash) the context is killed at once.

    A reply line longer than the result pipe's bound (pump.pump) is not kept: its result is over
    the cap, so only its exit code is read and ``result_overflow`` is set. A reply that is not
    the context's own (user code can write to the reply pipe) ends the context."""
    state: dict[str, Any] = {}
    limit = 2 * result_cap + pump.RESULT_SLACK
    ctx.reply_buf.clear()

    def keep() -> set[int]:
        return agent._keep_pids() - {ctx.pid}

    stop = pump.Interrupt(ctx.pid, keep)

    def kill() -> None:
        pump.kill_quietly(ctx.pid, keep=keep())

    def interrupt() -> None:
        if "done" not in state:
            stop.start()

    try:
        write_all(ctx.req_w, request, deadline)
    except BrokenPipeError:  # it ended just now: the cell did not run
        state["done"] = exit_status(agent, ctx)
    except TimeoutError:  # it does not read its requests (a cell left it busy or stopped)
        kill()
        state["done"] = DIED

    def on_extra(fd: int) -> None:
        try:
            chunk = os.read(fd, 1 << 20)
        except OSError:
            chunk = b""
        if not chunk:
            state["done"] = exit_status(agent, ctx)
            return
        if "done" in state:
            return  # a late write after the reply line (only user code writes to fd 4 then)
        state["result_bytes"] = state.get("result_bytes", 0) + len(chunk)
        if state.get("result_overflow"):
            if b"\n" in chunk:
                state["done"] = {"exit_code": _exit_code_of(bytes(ctx.reply_buf)), "signal": None,
                                 "peak_memory_kb": None}
            return
        ctx.reply_buf += chunk
        if b"\n" in ctx.reply_buf:
            raw, _, _ = bytes(ctx.reply_buf).partition(b"\n")
            msg = _reply(raw)
            if msg is None:
                kill()
                state["done"] = DIED
                return
            records = {k: msg[k] for k in ("result", "error") if msg.get(k)}  # as a one-shot's result fd has them
            state["result_raw"] = dumps(records).encode() if records else b""
            state["done"] = {"exit_code": msg["exit_code"], "signal": None,
                             "peak_memory_kb": msg.get("peak_memory_kb")}
            if stop.pending and note is not None:  # the cell answered its interrupt: the context lives on
                note["context_interrupted"] = True
        elif len(ctx.reply_buf) > limit:
            state["result_overflow"] = True
            del ctx.reply_buf[64:]  # keep the head: the exit code comes first

    def done() -> dict[str, Any] | None:
        if "done" in state:
            return state["done"]
        if ctx.pid in agent.exited:
            return procs.died(*agent.exited.pop(ctx.pid))
        stop.tick()
        return None

    watch = pump.Watch(pid=ctx.pid, is_done=done, extra_fds=[ctx.rep_r], on_extra=on_extra, persistent=True)
    return watch, (kill if note is None else interrupt), state


def write_all(fd: int, data: bytes, deadline: float) -> None:
    """All of ``data`` to the non-blocking pipe ``fd``, or TimeoutError once ``deadline`` (a
    monotonic time) passes with its reader not reading: the agent never blocks on a context."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise TimeoutError("the context does not read its requests") from None


def run_in_context(agent: Any, context_id: str, spec: dict[str, Any], req: dict[str, Any],
                   result_cap: int = pump.DEFAULT_OUTPUT_CAP):
    """Start a cell in the context (spawned on first use); (watch, kill, note, state). With
    ``arguments`` the context calls ``main(arguments)`` after the cell, as a one-shot run does.
    A context whose process ended during the cell (``process.exit(3)``) reports its real exit
    status (exit_status), not DIED."""
    msg: dict[str, Any] = {"code": spec["code"], "cwd": spec["cwd"]}
    if spec.get("arguments") is not None:
        msg["arguments"] = spec["arguments"]
    request = (dumps(msg) + "\n").encode()
    return run_in(agent, agent.js_contexts, lambda: spawn(agent, context_id), context_id, request,
                  spec["timeout"], result_cap, interruptible=True)


def run_in(agent: Any, table: dict[str, JsContext], make: Callable[[], JsContext], context_id: str,
           request: bytes | Callable[[JsContext, float], bytes], timeout: float, result_cap: int,
           interruptible: bool = False):
    """A cell in ``table[context_id]``, made by ``make`` on first use (a JS or a bash context);
    ``request`` (or what it returns) goes to the request pipe within ``timeout`` (the run's)."""
    # A context takes its next cell at once when idle; one that does not within WRITE_WAIT (a
    # Node spinning in a timer, a stopped shell) is ended, so the agent, which serves nothing
    # else while it waits, is held seconds at most, not the run's whole timeout.
    deadline = time.monotonic() + min(timeout, WRITE_WAIT)
    note: dict[str, Any] = {"context_id": context_id}
    ctx = table.get(context_id)
    if ctx is not None and agent._context_ended(ctx.pid):  # after its last reply (a late exit)
        agent._drop_context(context_id, table)
        ctx = None
    if ctx is None:
        agent._check_context_room()
        ctx = table[context_id] = make()
        note["context_new"] = True
        if (id(table), context_id) in agent.reset_contexts:
            agent.reset_contexts.discard((id(table), context_id))
            note["context_restarted"] = True
            note["context_note"] = RESTARTED
    ctx.executions += 1
    note["context_executions"] = ctx.executions
    try:
        data, stuck = (request(ctx, deadline) if callable(request) else request), False
    except TimeoutError:  # a bash context's command pipe stayed full
        data, stuck = b"", True
    watch, stop, state = start(agent, ctx, data, deadline, result_cap, note if interruptible else None)
    if stuck and "done" not in state:
        pump.kill_quietly(ctx.pid, keep=agent._keep_pids() - {ctx.pid})
        state["done"] = DIED
    return watch, stop, note, state
