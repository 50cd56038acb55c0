"""The ``execbox exec --json`` protocol (docs/exec-json.md): one bounded JSON request in, one JSON
reply out, exit 0 when the program ran and 2 with ``{"ok": false, "error": ...}`` otherwise.

Everything the host sends is checked here before the SDK sees it, so a wrong type is an SB002
reply rather than a traceback; the reply's size is bounded (stdin and artifact bytes have caps),
and an artifact that does not fit is reported in ``warnings`` instead of failing the run.
"""

from __future__ import annotations

import re
from typing import IO, Any

from ..agent.pump import INLINE_ARTIFACT_CAP
from ..errors import InvalidConfigError, PayloadTooLargeError, SandboxError
from ..models import Artifact, ExecutionResult

MAX_REQUEST_BYTES = 64 * 1024 * 1024
"""The most stdin bytes read (the service's default SANDBOX_MAX_REQUEST_BYTES)."""

ARTIFACT_BUDGET = INLINE_ARTIFACT_CAP
"""Total artifact bytes attached to one reply (the agent's inline-artifact cap, 16 MiB)."""

EXEC_FIELDS = {"code", "language", "timeout", "arguments", "provider", "config", "tenant_id", "files",
               "include_artifact_content"}


def read_request(stream: IO[bytes], limit: int | None = None, source: str = "stdin") -> bytes:
    """At most ``limit`` bytes of ``stream`` (default ``MAX_REQUEST_BYTES``); more is SB002
    (nothing past the limit is read)."""
    limit = MAX_REQUEST_BYTES if limit is None else limit
    raw = stream.read(limit + 1)
    if len(raw) > limit:
        raise PayloadTooLargeError(f"the input on {source} is larger than the limit of {limit} bytes",
                                   details={"field": "request", "limit": limit})
    return raw


def internal_error(e: BaseException) -> SandboxError:
    """SB000 for a failure nobody anticipated; only the exception's type is told (its message
    may hold request values, a provider secret among them)."""
    return SandboxError(f"internal error ({type(e).__name__}); please report it",
                        details={"exception": type(e).__name__})


def _optional_str(request: dict[str, Any], name: str) -> str | None:
    value = request.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidConfigError(f"{name} must be a string", details={"field": name})
    return value


def validate(request: Any) -> dict[str, Any]:
    """The request's fields, type-checked (SB002 naming the field otherwise)."""
    from ..settings import parse_duration

    if not isinstance(request, dict):
        raise InvalidConfigError("the request must be a JSON object", details={"field": "request"})
    unknown = sorted(set(request) - EXEC_FIELDS)
    if unknown:
        raise InvalidConfigError(f"unknown request fields: {', '.join(unknown)}",
                                 details={"fields": {k: "unknown field" for k in unknown}})
    code = request.get("code")
    if not isinstance(code, str):
        raise InvalidConfigError("code must be a string", details={"field": "code"})
    arguments = request.get("arguments")
    if arguments is not None and not isinstance(arguments, dict):
        raise InvalidConfigError("arguments must be a JSON object", details={"field": "arguments"})
    files = request.get("files") or {}
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise InvalidConfigError("files must map paths to text content", details={"field": "files"})
    config = request.get("config")
    if config is not None and not isinstance(config, dict):
        raise InvalidConfigError("config must be a JSON object", details={"field": "config"})
    include = request.get("include_artifact_content", True)
    if not isinstance(include, bool):
        raise InvalidConfigError("include_artifact_content must be true or false",
                                 details={"field": "include_artifact_content"})
    tenant_id = _optional_str(request, "tenant_id") or "default"
    from ..service.sessions.workspace import NAME_PATTERN  # the service's rule for tenant names

    if not re.fullmatch(NAME_PATTERN, tenant_id):
        raise InvalidConfigError("tenant_id must be 1-64 letters, digits, '_', '.' or '-' (not starting "
                                 "with '.' or '-')", details={"field": "tenant_id"})
    timeout = request.get("timeout")
    return {"code": code, "language": _optional_str(request, "language") or "python",
            "timeout": parse_duration(timeout, "timeout") if timeout is not None else None,
            "arguments": arguments, "files": files, "provider": _optional_str(request, "provider"),
            "config": config, "tenant_id": tenant_id, "include_artifact_content": include}


def attach_artifacts(artifacts: list[Artifact], budget: int = ARTIFACT_BUDGET
                     ) -> tuple[list[dict[str, Any]], list[str]]:
    """Each artifact's dict, with its bytes while they fit the reply's budget, and a warning for
    every one left without them (too big, over the budget, or unreadable): one artifact never
    costs the run its reply."""
    out: list[dict[str, Any]] = []
    warnings: list[str] = []
    left = budget
    for a in artifacts:
        reason = None
        if a.size > left:
            reason = (f"artifact {a.name!r} ({a.size} bytes) not attached: the reply's artifacts are "
                      f"limited to {budget} bytes in all ({left} left)")
        else:
            try:
                data = a.read_bytes()
            except SandboxError as e:
                reason = f"artifact {a.name!r} not attached: {e.code}: {e.message}"
            except Exception as e:  # noqa: BLE001 - a broken fetch costs this artifact only
                reason = f"artifact {a.name!r} not attached: {type(e).__name__}"
            else:
                if len(data) > left:
                    reason = f"artifact {a.name!r} not attached: larger than the {left} bytes left"
                else:
                    left -= len(data)
        item = a.to_dict(include_content=reason is None)
        if reason is not None:
            item["content_omitted"] = reason
            warnings.append(reason)
        out.append(item)
    return out, warnings


def reply_for(result: ExecutionResult, include_content: bool) -> dict[str, Any]:
    """The ``ok: true`` reply: the result, artifact bytes within the budget, warnings if any."""
    body = result.to_dict(include_artifact_content=False)
    reply: dict[str, Any] = {"ok": True, "result": body}
    if include_content:
        body["artifacts"], warnings = attach_artifacts(result.artifacts)
        if warnings:
            reply["warnings"] = warnings
    return reply


def handle_exec_request(request: Any) -> dict[str, Any]:
    """Validate, run once in a fresh sandbox, return the JSON reply."""
    from ..sdk.local import Sandbox

    req = validate(request)
    with Sandbox.create(req["provider"], config=req["config"], tenant_id=req["tenant_id"]) as sb:
        if req["files"]:
            sb.files.write_many(req["files"])
        result = sb.run_code(req["code"], req["language"], timeout=req["timeout"], arguments=req["arguments"])
        return reply_for(result, req["include_artifact_content"])  # bytes read while the box lives
