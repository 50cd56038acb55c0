"""The agent's ``exec`` reply -> ExecutionResult: one mapping for every provider that runs the agent.

Self-hosted boxes (agent_backed) and cloud sandboxes (remote_agent) get the same reply from the
same agent code, so result decoding, SB005/SB006 and artifact handling are written once, here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..models import Artifact, ExecutionResult, execution_error

CONTEXT_KEYS = ("context_id", "context_new", "context_restarted", "context_reset", "context_note",
                "context_executions", "cancelled")


def result_from_reply(v: dict[str, Any], metadata: dict[str, Any], *, oom: bool, wall: float,
                      fetch: Callable[[str], bytes] | None) -> ExecutionResult:
    """Build the result; ``metadata`` holds the provider's own keys and is completed in place."""
    res = v.get("result")
    present = bool(res and res.get("present"))
    metadata.update({
        "language": v.get("language"),
        "peak_memory_kb": v.get("peak_memory_kb"),
        "result_present": present,
        "result_type": res.get("type") if res else None,
        "host_overhead_ms": round((wall - float(v.get("execution_time", 0.0))) * 1000, 3),
    })
    if v.get("signal"):
        metadata["signal"] = v["signal"]
    for key in CONTEXT_KEYS:
        if v.get(key) is not None:
            metadata[key] = v[key]
    if v.get("timed_out"):
        metadata["error_code"] = "SB005"
        metadata["error_message"] = timeout_message(v)
        waits = v.get("exit_waits_for")
        if isinstance(waits, list) and waits:  # its code had finished: python3 would hang the same way
            names = ", ".join(str(n) for n in waits)
            metadata["error_message"] += (f" (the program's code had finished; it was waiting for its non-daemon "
                                          f"threads to end, as python3 does: {names}. Make them daemon threads or "
                                          "stop them before the program ends)")
    elif oom or v.get("oom"):
        metadata["error_code"] = "SB006"
        metadata["error_message"] = "execution ran out of memory"
    return ExecutionResult(
        stdout=v.get("stdout", ""), stderr=v.get("stderr", ""), exit_code=int(v.get("exit_code", -1)),
        execution_time=float(v.get("execution_time", 0.0)), metadata=metadata,
        timed_out=bool(v.get("timed_out")), truncated=bool(v.get("truncated")),
        result=json.loads(res["json"]) if present else None,
        artifacts=[Artifact.from_dict(a, fetch) for a in v.get("artifacts") or []],
        error=reply_error(v),
    )


def reply_error(v: dict[str, Any]) -> dict[str, str] | None:
    """The reply's ``error`` (the exception that ended the user's code), or None: an agent older
    than the field sends none, and a malformed one is dropped rather than failing the run."""
    try:
        return execution_error(v.get("error"))
    except ValueError:
        return None


def timeout_message(v: dict[str, Any]) -> str:
    """What a timeout did: a context cell the agent interrupted keeps its context's state (the
    context lives on: no ``context_reset``); anything else, a one-shot run or a cell that would not
    stop, had its process tree killed (and a context's state is gone)."""
    ctx = v.get("context_id")
    if ctx is None:
        return "execution timed out; the process tree was killed"
    if v.get("context_reset"):
        return f"execution timed out; context {ctx!r} was killed and its state is lost (the next run starts fresh)"
    return f"execution timed out; the cell was interrupted and context {ctx!r} keeps its state"
