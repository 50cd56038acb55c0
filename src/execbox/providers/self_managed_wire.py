"""The executor ``/run`` answer -> ExecutionResult, for provider ``self_managed`` (``api: run``).

The remote executor is another party's server: every field is checked for its type before use
(a malformed one is SB009 naming the field), output is held to the cap the in-box agent applies
(``truncated`` set past it), and artifacts are rebuilt from their bytes (size and sha256 computed
here, never taken from the answer) under names that pass the workspace path rules, so a name such
as ``../../etc/passwd`` never reaches a caller that saves artifacts to disk.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from ..agent.paths import PathViolation, check_syntax
from ..agent.pump import MAX_ARTIFACTS
from ..errors import CodeBlockedError, InstanceCreationError, ProviderUnavailableError, SandboxError
from ..models import Artifact, ExecutionResult, Isolation, Language
from ..sdk.wire import typed_error
from .output_cap import OUTPUT_CAP, cap_text

STATUSES = ("success", "program_error", "resource_limit_exceeded", "unauthorized_access", "runtime_error",
            "program_runner_error")
RESOURCE_LIMIT_TYPES = ("time", "memory", "output")
UNAUTHORIZED_ACCESS_TYPES = ("disallowed_syscall", "file_access", "network_access")
RUNTIME_ERROR_TYPES = ("signalled", "nonzero_exit")
WIRE_LANGUAGES = {Language.PYTHON: "python", Language.JAVASCRIPT: "nodejs"}
_TIERS = {tier.value for tier in Isolation}


def malformed(field: str, why: str) -> ProviderUnavailableError:
    return ProviderUnavailableError(f"the remote executor's /run answer has a malformed {field!r}: {why}",
                                    details={"field": field})


def _opt(body: dict[str, Any], key: str, *types: type) -> Any:
    """``body[key]`` when it is None or one of ``types`` (never a bool posing as a number)."""
    value = body.get(key)
    if value is None or (isinstance(value, types) and not isinstance(value, bool)):
        return value
    raise malformed(key, f"expected {' or '.join(t.__name__ for t in types)}, got {type(value).__name__}")


def artifacts_from(items: Any) -> tuple[list[Artifact], list[str]]:
    """Artifacts rebuilt from their bytes; the ones refused, as short reasons (no bytes echoed)."""
    if items is None:
        return [], []
    if not isinstance(items, list):
        raise malformed("artifacts", f"expected a list, got {type(items).__name__}")
    out: list[Artifact] = []
    problems: list[str] = []
    for i, a in enumerate(items):
        if len(out) >= MAX_ARTIFACTS:
            problems.append(f"more than {MAX_ARTIFACTS} artifacts: the rest were dropped")
            break
        if not isinstance(a, dict):
            problems.append(f"artifact #{i}: not an object")
            continue
        try:
            name = check_syntax(a.get("name"))
        except PathViolation as e:
            problems.append(f"artifact #{i}: {e.reason}")
            continue
        if name == ".":
            problems.append(f"artifact #{i}: empty name")
            continue
        b64 = a.get("content_b64")
        try:
            data = base64.b64decode(b64, validate=True) if b64 is not None else b""
        except (binascii.Error, TypeError, ValueError):
            problems.append(f"artifact {name!r}: content_b64 is not base64")
            continue
        mime = a.get("mime_type")
        out.append(Artifact(name=name, mime_type=mime if isinstance(mime, str) and mime else "application/octet-stream",
                            size=len(data), sha256=hashlib.sha256(data).hexdigest(), path=name, _data=data))
    return out, problems


def _sb_for_runner_error(body: dict[str, Any], http_status: int) -> SandboxError:
    """A ``program_runner_error`` (the runner failed, not the program) as a typed SB error."""
    if isinstance(body.get("error"), dict):  # execbox's executor adds its SB error
        return typed_error(body["error"], http_status if http_status >= 400 else None)
    detail = str(body.get("detail") or "")
    stderr = str(body.get("stderr") or "")
    message = f"remote executor: {detail or 'runner error'}" + (f": {stderr[:500]}" if stderr else "")
    details = {"status": body.get("status"), "detail": detail[:500], "exit_code": _opt(body, "exit_code", int)}
    if detail == "Code is unsafe":  # RAGFlow's AST filter
        return CodeBlockedError(message, details=details)
    if detail == "no_available_container" or "pool is busy" in stderr.lower():
        return InstanceCreationError(message, details=details)
    return ProviderUnavailableError(message, details=details)


def run_response_to_result(body: dict[str, Any], *, provider: str, instance_id: str, wall: float,
                           default_isolation: str, http_status: int = 200) -> ExecutionResult:
    """Map a ``/run`` response to an ExecutionResult (raising for runner errors and malformed fields)."""
    status = body.get("status")
    if status not in STATUSES:
        raise ProviderUnavailableError(
            f"remote executor answered HTTP {http_status} without a known /run status",
            details={"http_status": http_status, "status": status if isinstance(status, str) else None})
    if status == "program_runner_error":
        raise _sb_for_runner_error(body, http_status)
    limit = _opt(body, "resource_limit_type", str)
    time_used = _opt(body, "time_used_ms", int, float)
    exit_code = _opt(body, "exit_code", int)
    detail = _opt(body, "detail", str)
    isolation = _opt(body, "isolation", str)
    metadata: dict[str, Any] = {
        "provider": provider,
        "isolation": isolation if isolation in _TIERS else default_isolation,
        "instance_id": instance_id,
        "remote_status": status,
        "detail": detail,
        "time_used_ms": time_used,
        "peak_memory_kb": _opt(body, "memory_used_kb", int, float),
        "host_overhead_ms": round(wall * 1000 - float(time_used or 0.0), 3),
    }
    for key in ("resource_limit_type", "unauthorized_access_type", "runtime_error_type"):
        if _opt(body, key, str):
            metadata[key] = body[key]
    timed_out = status == "resource_limit_exceeded" and limit == "time"
    if timed_out:
        metadata["error_code"] = "SB005"
        metadata["error_message"] = detail or "execution timed out"
    elif status == "resource_limit_exceeded" and limit == "memory":
        metadata["error_code"] = "SB006"
        metadata["error_message"] = detail or "execution ran out of memory"
    elif status == "unauthorized_access":
        metadata["error_code"] = "SB007"
        denied = body.get("unauthorized_access_type") or "an operation"
        metadata["error_message"] = f"the sandbox denied {denied}"
    res = _opt(body, "result", dict) or {}
    present = bool(res.get("present"))
    metadata["result_present"] = present
    metadata["result_type"] = res.get("type") if present and isinstance(res.get("type"), str) else None
    artifacts, problems = artifacts_from(body.get("artifacts"))
    if problems:
        metadata["artifact_problems"] = problems[:20]
    stdout, cut_out = cap_text(_opt(body, "stdout", str) or "", OUTPUT_CAP)
    stderr, cut_err = cap_text(_opt(body, "stderr", str) or "", OUTPUT_CAP)
    return ExecutionResult(
        stdout=stdout, stderr=stderr,
        exit_code=exit_code if exit_code is not None else (0 if status == "success" else 1),
        execution_time=float(time_used or wall * 1000) / 1000.0,
        metadata=metadata, timed_out=timed_out,
        truncated=(status == "resource_limit_exceeded" and limit == "output") or cut_out or cut_err,
        result=res.get("value") if present else None, artifacts=artifacts,
    )
