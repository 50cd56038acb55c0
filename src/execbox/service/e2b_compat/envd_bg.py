"""envd processes as the agent's background processes: start, follow (poll), stdin, signal.

Used for every provider with ``supports_background_processes`` (all agent-backed ones). The
process runs in the box on its own; it holds neither the session nor the agent, so run_code,
files and other commands go on beside it. One follower thread per process polls the agent for
output (2 ms after activity, backing off to 50 ms when idle) and fans it out to every Start /
Connect stream; when the deadline (the SDK's request timeout, at most the sandbox's end) passes,
it kills the process's whole job.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from protobuf import Oneof

from ...errors import SandboxError, SessionNotFoundError
from ..background import end_status
from ..executions import RunSpec
from .envd_gen.process import process_pb as pb

log = logging.getLogger("execbox.service.e2b")

POLL_FAST = 0.002
POLL_IDLE = 0.05


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


def follow(state: Any, sb: Any, proc: Any, deadline: float, spec: RunSpec, forget: Any) -> None:
    """Thread body: relay the process's output and end to its subscribers, then audit it."""
    provider, iid, pid = proc.provider, proc.instance_id, proc.pid
    started = time.monotonic()
    out_off = err_off = 0
    delay = POLL_FAST
    timed_out = False
    last: dict[str, Any] | None = None
    error: str | None = None
    while True:
        if not timed_out and time.monotonic() >= deadline:
            timed_out = True
            try:
                provider.signal_process(iid, pid, "SIGKILL")
            except SandboxError:
                pass
        try:
            v = provider.poll_process(iid, pid, out_off, err_off)
        except SessionNotFoundError:
            error = "the sandbox was killed"
            break
        except SandboxError as e:
            if e.details.get("busy"):  # the agent is in a long file operation: ask again
                time.sleep(POLL_IDLE)
                continue
            error = f"{e.code}: {e.message}"
            break
        except Exception as e:  # noqa: BLE001 - reported in the end event; the server stays up
            log.exception("following process %s failed", pid)
            error = str(e)
            break
        got = False
        for stream, off_key in (("stdout", "out"), ("stderr", "err")):
            chunk = v[stream]
            if chunk:
                got = True
                proc.publish(_data("pty" if proc.pty and stream == "stdout" else stream, chunk))
                if off_key == "out":
                    out_off += len(chunk)
                else:
                    err_off += len(chunk)
        if v.get("exited"):
            last = v
            break
        delay = POLL_FAST if got else min(delay * 2, POLL_IDLE)
        time.sleep(delay)
    proc.publish(end_event(last, timed_out, error))
    proc.publish(None)
    forget()
    status = end_status(last, timed_out)
    try:
        state.runs.record(spec, provider.name, iid, started, status,
                          last.get("exit_code") if last else None, "SB005" if timed_out else None)
    except Exception:  # noqa: BLE001 - auditing must not break the stream
        log.exception("recording process %s failed", pid)


def start_follower(*args: Any) -> None:
    threading.Thread(target=follow, args=args, name=f"execbox-e2b-proc-{args[2].pid}", daemon=True).start()
