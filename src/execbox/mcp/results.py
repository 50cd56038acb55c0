"""ExecutionResult and errors as MCP tool results: text for the model, structured content for code."""

from __future__ import annotations

import base64
import json
from typing import Any

import mcp_types as types

from ..errors import SandboxError
from ..models import ExecutionResult
from .output_cap import DEFAULT_MAX_OUTPUT, cap_stream

IMAGE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp", "image/svg+xml"}
MAX_INLINE_IMAGE = 4 * 1024 * 1024
"""Larger images are sent as resource links rather than inline base64."""


def file_uri(session_id: str | None, path: str) -> str:
    return f"execbox://sessions/{session_id}/files/{path}"


def error_result(e: SandboxError, extra: dict[str, Any] | None = None) -> types.CallToolResult:
    """A tool error the model can read and act on: the SB code, the message, the details."""
    body = e.to_dict()["error"]
    if extra:
        body = {**body, **extra}
    text = f"error {e.code}: {e.message}"
    hint = _hint(e.code)
    if hint:
        text += f"\n{hint}"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content={"error": body}, is_error=True)


def _hint(code: str, metadata: dict[str, Any] | None = None) -> str:
    if code == "SB005":
        return _timeout_hint(metadata or {})
    return {
        "SB006": "The run ran out of memory (an allocation failed or it was killed); process less data at once.",
        "SB008": "Too many concurrent requests for this tenant; retry shortly.",
    }.get(code, "")


def _timeout_hint(metadata: dict[str, Any]) -> str:
    """What a timeout did, as the run's metadata tells it (providers/agent_result.timeout_message):
    a context cell that was only interrupted keeps its state, and a model must not rebuild it."""
    todo = "shorten the work or pass a larger timeout."
    if "context_id" not in metadata:
        return "The run exceeded its timeout and was stopped; " + todo
    if metadata.get("context_reset"):
        return "The run exceeded its timeout and its context was killed: its state is lost; " + todo
    return ("The run exceeded its timeout and was interrupted; its context keeps its state (names defined "
            "before are still there); " + todo)


def execution_result(result: ExecutionResult, session_id: str | None,
                     notes: list[str] | None = None, max_output: int = DEFAULT_MAX_OUTPUT) -> types.CallToolResult:
    """stdout/stderr/exit code/result as text, the full record as structured content,
    images inline, other artifacts as resource links (session runs) or descriptions (one-shot).
    stdout and stderr are capped at ``max_output`` characters each for the model (output_cap.py),
    in the text and the structured content alike; ``output_capped`` says what was cut."""
    structured = result.to_dict()
    structured["session_id"] = session_id
    if notes:
        structured["notes"] = notes
    lines = [f"exit_code: {result.exit_code}"]
    if result.result is not None:
        lines.append("result: " + json.dumps(result.result, ensure_ascii=False)[:20000])
    capped: dict[str, Any] = {}
    for stream in ("stdout", "stderr"):
        text = getattr(result, stream)
        if not text:
            continue
        shown = cap_stream(text, max_output, stream)
        if shown.cut:
            structured[stream] = shown.text
            capped[stream] = {"characters": shown.total, "cut": shown.cut, "limit": max_output}
        lines.append(f"{stream}:\n{shown.text}")
    if capped:
        structured["output_capped"] = capped
    if result.truncated:
        lines.append("note: output was truncated at the sandbox's output cap")
    if result.error_code or result.timed_out:
        code = result.error_code or "SB005"
        lines.append(f"error {code}: {result.metadata.get('error_message') or 'the run failed'}")
        hint = _hint(code, result.metadata)
        if hint:
            lines.append(hint)
    if result.metadata.get("context_note"):  # its state is gone: the model must not assume it
        lines.append(f"note: {result.metadata['context_note']}")
    for note in notes or []:
        lines.append(f"note: {note}")
    if session_id is not None:
        lines.append(f"session_id: {session_id}")
    content: list[Any] = [types.TextContent(type="text", text="\n".join(lines))]
    for art in result.artifacts:
        content.append(_artifact_content(art, session_id))
    is_error = bool(result.error_code) or result.timed_out
    return types.CallToolResult(content=content, structured_content=structured, is_error=is_error)


def _artifact_content(art: Any, session_id: str | None) -> Any:
    path = art.path or art.name
    if art.mime_type in IMAGE_TYPES and art.size <= MAX_INLINE_IMAGE:
        try:
            data = art.read_bytes()
        except SandboxError:
            data = None
        if data is not None:
            return types.ImageContent(type="image", data=base64.b64encode(data).decode(), mime_type=art.mime_type)
    if session_id is not None:
        return types.ResourceLink(type="resource_link", name=art.name, uri=file_uri(session_id, path),
                                  mime_type=art.mime_type, size=art.size,
                                  description=f"artifact written by the run (sha256 {art.sha256})")
    return types.TextContent(type="text", text=f"artifact {art.name} ({art.mime_type}, {art.size} bytes): "
                                               "run in a session to fetch artifacts as resources")


def data_result(text: str, structured: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=structured, is_error=False)
