"""ExecutionResult -> RAGFlow executor ``/run`` response: status, the ``*_type`` fields, artifacts,
the structured result, and the bodies for runner failures and bad requests.

Kept apart from the routes so the mapping can be read (and tested) as one table.

Artifacts come back inline (base64) up to ``EXECBOX_EXECUTOR_MAX_ARTIFACT_BYTES`` in total per
call (default 10 MiB: RAGFlow's own executor returns no file over 10 MiB, and its code component
turns artifacts into chart and table attachments). Each call holds its artifacts several times
over (bytes, base64, JSON) until answered, so concurrent calls multiply the cap in server memory.
An artifact that does not fit is left out (not fetched from the box, unless the agent already sent
it inline with the run's result: it does so up to 16 MiB whatever this cap is), and named (with its
size, the cap and the setting) in ``detail``, as other artifacts that cannot be returned are.
"""

from __future__ import annotations

import base64
import signal
from typing import Any

from fastapi.responses import JSONResponse

from ...errors import CodeBlockedError, InvalidConfigError, SandboxError
from ...models import ExecutionResult
from ...settings import env_int

ARTIFACT_BYTES_ENV = "EXECBOX_EXECUTOR_MAX_ARTIFACT_BYTES"
DEFAULT_MAX_ARTIFACT_BYTES = 10 * 1024 * 1024
"""Total artifact bytes (before base64) one /run returns inline by default."""
RUNNER_ERROR_EXIT = -999  # RAGFlow's exit_code for a runner (not program) failure

_NETWORK_MARKERS = ("Network is unreachable", "ENETUNREACH", "Temporary failure in name resolution",
                    "Name or service not known", "EAI_AGAIN", "getaddrinfo ENOTFOUND")
_FILE_MARKERS = ("Permission denied", "PermissionError", "EACCES", "Read-only file system", "EROFS")


def _stderr_tail(stderr: str, lines: int = 3) -> str:
    return "\n".join([ln for ln in stderr.splitlines() if ln.strip()][-lines:])


def classify(result: ExecutionResult) -> dict[str, Any]:
    """status, the three *_type fields and detail for one ExecutionResult."""
    out: dict[str, Any] = {"status": "success", "resource_limit_type": None, "unauthorized_access_type": None,
                           "runtime_error_type": None, "detail": None}
    sig = result.metadata.get("signal")
    tail = _stderr_tail(result.stderr)
    if result.timed_out or result.error_code == "SB005":
        out.update(status="resource_limit_exceeded", resource_limit_type="time",
                   detail=result.metadata.get("error_message") or "execution timed out")
    elif result.error_code == "SB006":  # the agent's verdict (agent/pump.looks_oom); stderr is not read again:
        # a program's own ``raise MemoryError("budget")`` is its error, not a memory limit
        out.update(status="resource_limit_exceeded", resource_limit_type="memory",
                   detail=result.metadata.get("error_message") or "execution ran out of memory")
    elif sig == signal.SIGSYS:
        out.update(status="unauthorized_access", unauthorized_access_type="disallowed_syscall",
                   detail="killed by SIGSYS: a system call the sandbox does not allow")
    elif result.exit_code != 0:
        if any(m in tail for m in _NETWORK_MARKERS):
            out.update(status="unauthorized_access", unauthorized_access_type="network_access",
                       detail="network access is not allowed in this sandbox")
        elif "Operation not permitted" in tail or "EPERM" in tail:
            out.update(status="unauthorized_access", unauthorized_access_type="disallowed_syscall",
                       detail="operation not permitted by the sandbox")
        elif any(m in tail for m in _FILE_MARKERS):
            out.update(status="unauthorized_access", unauthorized_access_type="file_access",
                       detail="file access denied by the sandbox")
        elif sig or result.exit_code < 0:
            name = _signal_name(sig or -result.exit_code)
            out.update(status="runtime_error", runtime_error_type="signalled", detail=f"killed by {name}")
        else:
            out.update(status="program_error", runtime_error_type="nonzero_exit",
                       detail=f"exited with code {result.exit_code}")
    elif result.truncated:
        out.update(status="resource_limit_exceeded", resource_limit_type="output",
                   detail="output exceeded the cap and was truncated")
    return out


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def max_artifact_bytes_from_env() -> int:
    """EXECBOX_EXECUTOR_MAX_ARTIFACT_BYTES (a whole number of bytes; ``0``: no artifact inline), or
    the default; a bad value is SB002 naming it (read when the app is built: a bad one stops start)."""
    return env_int(ARTIFACT_BYTES_ENV, DEFAULT_MAX_ARTIFACT_BYTES)


def artifact_items(result: ExecutionResult, limit: int = DEFAULT_MAX_ARTIFACT_BYTES
                   ) -> tuple[list[dict[str, Any]], list[str]]:
    """The artifacts returned inline, at most ``limit`` bytes together (in the run's order), and a
    note for each one left out: too large for what is left of ``limit`` (not read at all), or
    unreadable."""
    items, problems, budget = [], [], limit
    for a in result.artifacts:
        if a.size > budget:  # never read (or fetched from the box) just to be dropped
            problems.append(_skipped(a.name, a.size, limit))
            continue
        try:
            data = a.read_bytes()  # inline bytes, or fetched while the instance still exists
        except SandboxError as e:
            problems.append(f"{a.name}: {e.message}")
            continue
        if len(data) > budget:
            problems.append(_skipped(a.name, len(data), limit))
            continue
        budget -= len(data)
        items.append({"name": a.name, "mime_type": a.mime_type, "size": len(data),
                      "content_b64": base64.b64encode(data).decode("ascii")})
    return items, problems


def _skipped(name: str, size: int, limit: int) -> str:
    return (f"{name}: skipped ({size} bytes), artifacts returned inline are at most {limit} bytes in total "
            f"({ARTIFACT_BYTES_ENV})")


def result_to_response(result: ExecutionResult, artifacts: list[dict[str, Any]] | None = None,
                       artifact_problems: list[str] | None = None) -> dict[str, Any]:
    """The /run response body for an ExecutionResult (artifacts already read)."""
    fields = classify(result)
    if artifact_problems:
        note = "artifacts not returned: " + "; ".join(artifact_problems)
        fields["detail"] = f"{fields['detail']}; {note}" if fields["detail"] else note
    present = bool(result.metadata.get("result_present", result.result is not None))
    peak = result.metadata.get("peak_memory_kb")
    body = {
        **fields,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "exit_code": result.exit_code,
        "time_used_ms": round(result.execution_time * 1000, 3),
        "memory_used_kb": float(peak) if peak is not None else None,
        "artifacts": artifacts or [],
        "result": {"present": present, "value": result.result if present else None,
                   "type": (result.metadata.get("result_type") or "json") if present else "json"},
        "isolation": result.metadata.get("isolation"),
    }
    return body


def runner_error_response(err: SandboxError) -> JSONResponse:
    """A failure of the runner (not of the program): RAGFlow's shape, a real HTTP status, the SB error."""
    if isinstance(err, CodeBlockedError):
        stderr, detail = f"Line {err.details.get('line', 0)}: {err.message}", "Code is unsafe"
    else:
        stderr, detail = err.message, f"{err.code}: {err.message}"
    body = {"status": "program_runner_error", "stdout": "", "stderr": stderr, "exit_code": RUNNER_ERROR_EXIT,
            "detail": detail, "time_used_ms": None, "memory_used_kb": None, "resource_limit_type": None,
            "unauthorized_access_type": None, "runtime_error_type": None, "artifacts": [], "result": None,
            "isolation": None, **err.to_dict()}
    return JSONResponse(body, status_code=err.http_status)


def validation_response(errors: list[dict[str, Any]]) -> JSONResponse:
    """422 with FastAPI's ``detail`` list (what RAGFlow's executor answers) plus the SB002 error."""
    detail = []
    for e in errors:
        item = {"type": e.get("type"), "loc": ["body", *e.get("loc", ())], "msg": e.get("msg")}
        if e.get("ctx"):
            item["ctx"] = {k: str(v) for k, v in e["ctx"].items()}
        detail.append(item)
    fields = {".".join(str(p) for p in d["loc"][1:]) or "body": d["msg"] for d in detail}
    err = InvalidConfigError("invalid /run request: " + "; ".join(f"{k}: {v}" for k, v in fields.items()),
                             details={"fields": fields}, http_status=422)
    return JSONResponse({"detail": detail, **err.to_dict()}, status_code=422)
