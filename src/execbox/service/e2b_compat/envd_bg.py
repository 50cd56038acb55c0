"""envd processes as the agent's background processes: start, follow (poll), stdin, signal.

Used for every provider with ``supports_background_processes`` (all agent-backed ones). The
process runs in the box on its own; it holds neither the session nor the agent, so run_code,
files and other commands go on beside it. One follower thread per process (``service/follower.py``,
shared with the HTTP API; idle polls here back off to 50 ms) fans its output out to every Start /
Connect stream; when the deadline (the SDK's request timeout, at most the sandbox's end) passes,
it kills the process's whole job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from protobuf import Oneof

from ...errors import SessionNotFoundError
from ..executions import RunSpec
from ..follower import Follower
from .envd_gen.process import process_pb as pb


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


def end_event(poll: dict[str, Any] | None, timed_out: bool, error: str | None) -> pb.ProcessEvent:
    if poll is None:
        end = pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status="error", error=error)
    elif timed_out:
        end = pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status="timeout", error="command timed out")
    elif poll.get("signal"):
        name = {9: "killed", 15: "terminated", 2: "interrupt", 1: "hangup"}.get(poll["signal"], str(poll["signal"]))
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
        super().__init__(proc.provider, proc.instance_id, proc.pid, deadline, state.runs, spec, time.monotonic())
        self.proc, self.forget = proc, forget
        self.out_off = self.err_off = 0

    def offsets(self) -> tuple[int, int, bool]:
        return self.out_off, self.err_off, False

    def take(self, poll: dict[str, Any]) -> None:
        if poll["stdout"]:
            self.proc.publish(_data("pty" if self.proc.pty else "stdout", poll["stdout"]))
            self.out_off += len(poll["stdout"])
        if poll["stderr"]:
            self.proc.publish(_data("stderr", poll["stderr"]))
            self.err_off += len(poll["stderr"])

    def lost(self, e: Exception) -> str:
        return "the sandbox was killed" if isinstance(e, SessionNotFoundError) else super().lost(e)

    def ended(self) -> None:
        self.proc.publish(end_event(self.last, self.timed_out, self.error))
        self.proc.publish(None)
        self.forget()


def start_follower(state: Any, sb: Any, proc: Any, deadline: float, spec: RunSpec, forget: Callable[[], None]) -> None:
    """Follow ``proc`` (an envd_process.Proc) in a thread until it ends, then audit it."""
    _Follower(state, proc, deadline, spec, forget).start(f"execbox-e2b-proc-{proc.pid}")
