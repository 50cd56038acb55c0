"""ExecutionResult and errors as MCP tool results: text for the model, structured content for code."""

from __future__ import annotations

import base64
import json
from typing import Any

import mcp_types as types

from ..errors import SandboxError
from ..models import ExecutionResult
from .output_cap import DEFAULT_MAX_OUTPUT, cap_stream
from .resource_cap import DEFAULT_MAX_RESOURCE_BYTES, TEXT_TYPES, how_to_read
from .resource_cap import ENV as RESOURCE_ENV

IMAGE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp", "image/svg+xml"}
RESULT_HOW = ("To read all of it, have main() write the value to a file (e.g. json.dump(value, open('out.json', "
              "'w'))) and page that file with read_file (offset, limit; a long line with char_offset)")
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
    hint = _hint(e.code, details=e.details)
    if hint:
        text += f"\n{hint}"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content={"error": body}, is_error=True)


def _hint(code: str, metadata: dict[str, Any] | None = None, details: dict[str, Any] | None = None) -> str:
    if code == "SB005":
        return _timeout_hint(metadata or {})
    if code == "SB008":
        return _limit_hint(details or {})
    return {
        "SB006": "The run ran out of memory (an allocation failed or it was killed); process less data at once.",
    }.get(code, "")


PROCESS_CAP = ("A background process must end first: kill_process one you no longer need (list_processes shows "
               "them), or wait for one to exit; retrying at once fails the same way.")
LIMIT_HINTS = {  # SB008's details.reason (or details.field) -> what frees the limit (review 32, F5)
    "tenant_max_background_processes": PROCESS_CAP,
    "max_background_processes": PROCESS_CAP,
    "tenant_max_sessions": ("This tenant holds all the sessions it may: close_session one you no longer need "
                            "(list_sessions shows them), or retry when an idle one expires."),
    "gpu_tenant_cap": "This tenant's GPUs are all in use: close_session a GPU session you no longer need.",
    "context_id": "The sandbox holds all the code contexts it may: run in an existing context_id instead.",
    "tenant_max_executions": "Too many runs at once for this tenant; retry shortly.",
    "tenant_max_requests": "Too many concurrent requests for this tenant; retry shortly.",
    "mcp_sessions": "Too many MCP sessions are open; retry shortly.",
}


def _limit_hint(details: dict[str, Any]) -> str:
    """What frees the SB008 limit that was hit: retrying helps a concurrency cap, not a cap on
    what is held (processes, sessions, GPUs, contexts)."""
    if "written" in details:  # a process's stdin is full (agent/background.py)
        return "The process is not reading its stdin; write to it again once it reads, or kill_process it."
    for key in (details.get("reason"), details.get("field")):
        if key in LIMIT_HINTS:
            return LIMIT_HINTS[key]
    if details.get("field") == "command":  # the box's own cap on background processes (agent/background.py)
        return PROCESS_CAP
    if details.get("retry_after"):
        return f"A limit was reached; retry in about {details['retry_after']} s."
    return "A limit was reached (see details); free what holds it or retry shortly."


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
                     notes: list[str] | None = None, max_output: int = DEFAULT_MAX_OUTPUT,
                     max_resource_bytes: int = DEFAULT_MAX_RESOURCE_BYTES) -> types.CallToolResult:
    """stdout/stderr/exit code/result as text, the full record as structured content,
    images inline, other artifacts as resource links (session runs) or descriptions (one-shot, or
    larger than one resources/read gives: ``max_resource_bytes``, with how to read them instead).
    stdout, stderr and main()'s JSON result are capped at ``max_output`` characters each for the model
    (output_cap.py), in the text and the structured content alike (a capped ``result`` is its capped
    JSON text); ``output_capped`` says what was cut."""
    structured = result.to_dict()
    structured["session_id"] = session_id
    if notes:
        structured["notes"] = notes
    lines = [f"exit_code: {result.exit_code}"]
    capped: dict[str, Any] = {}
    if result.result is not None:  # main()'s return value, as JSON: capped as a stream is
        shown = cap_stream(json.dumps(result.result, ensure_ascii=False), max_output, "result", RESULT_HOW)
        if shown.cut:  # the code-facing copy is the same capped JSON text (output_capped says so)
            structured["result"] = shown.text
            capped["result"] = {"characters": shown.total, "cut": shown.cut, "limit": max_output}
        lines.append("result: " + shown.text)
    for stream in ("stdout", "stderr"):
        text = getattr(result, stream)
        if not text:
            continue
        shown = cap_stream(text, max_output, stream)
        if shown.cut:
            structured[stream] = shown.text
            capped[stream] = {"characters": shown.total, "cut": shown.cut, "limit": max_output}
        lines.append(f"{stream}:\n{shown.text}")
    if result.error:  # the exception that ended the code; its traceback is in stderr too
        error = dict(result.error)
        for key in ("value", "traceback"):
            shown = cap_stream(str(error.get(key) or ""), max_output, f"error.{key}")
            if shown.cut:
                error[key] = shown.text
                capped[f"error.{key}"] = {"characters": shown.total, "cut": shown.cut, "limit": max_output}
        structured["error"] = error
        value = str(error.get("value") or "")
        first = value.splitlines()[0][:500] if value.strip() else ""
        lines.append(f"exception: {error.get('name')}" + (f": {first}" if first else ""))
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
    if result.metadata.get("cancelled") and not result.timed_out:  # interrupt_run, or the service's own stop
        why = result.metadata.get("cancelled_reason")
        lines.append("interrupted: the run was stopped before it finished" + (f" ({why})" if why else ""))
        structured["interrupted"] = True
    if result.metadata.get("context_note"):  # its state is gone: the model must not assume it
        lines.append(f"note: {result.metadata['context_note']}")
    for note in notes or []:
        lines.append(f"note: {note}")
    if session_id is not None:
        lines.append(f"session_id: {session_id}")
    content: list[Any] = [types.TextContent(type="text", text="\n".join(lines))]
    for art in result.artifacts:
        content.append(_artifact_content(art, session_id, max_resource_bytes))
    is_error = bool(result.error_code) or result.timed_out
    return types.CallToolResult(content=content, structured_content=structured, is_error=is_error)


def _artifact_content(art: Any, session_id: str | None, max_resource_bytes: int = DEFAULT_MAX_RESOURCE_BYTES) -> Any:
    path = art.path or art.name
    if art.mime_type in IMAGE_TYPES and art.size <= MAX_INLINE_IMAGE:
        try:
            data = art.read_bytes()
        except SandboxError:
            data = None
        if data is not None:
            return types.ImageContent(type="image", data=base64.b64encode(data).decode(), mime_type=art.mime_type)
    if session_id is not None and art.size > max_resource_bytes:  # a link resources/read would refuse
        _, how = how_to_read(session_id, path, max_resource_bytes, str(art.mime_type).startswith(TEXT_TYPES))
        return types.TextContent(type="text", text=(
            f"artifact {art.name} ({art.mime_type}, {art.size} bytes) at {path}: over the {max_resource_bytes}-byte "
            f"limit of one resources/read ({RESOURCE_ENV}); to read it, {how}"))
    if session_id is not None:
        return types.ResourceLink(type="resource_link", name=art.name, uri=file_uri(session_id, path),
                                  mime_type=art.mime_type, size=art.size,
                                  description=f"artifact written by the run (sha256 {art.sha256})")
    return types.TextContent(type="text", text=f"artifact {art.name} ({art.mime_type}, {art.size} bytes): "
                                               "run in a session to fetch artifacts as resources")


def data_result(text: str, structured: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=structured, is_error=False)


def process_state(p: dict[str, Any]) -> str:
    """One line a model reads about a background process: its pid, how it is, its command."""
    status = p.get("status")
    if status == "running" and p.get("exited_in_box"):  # its exit status comes with the last of its output
        left = (int(p.get("stdout_waiting") or 0) + int(p.get("stderr_waiting") or 0) if "stdout_waiting" in p
                else int(p.get("stdout_size") or 0) + int(p.get("stderr_size") or 0))
        state = (f"exited in the box, {left} bytes of output left to read (the exit code comes with the last "
                 "of them)" if "stdout_waiting" in p else
                 "exited in the box, its output not all read yet (the exit code comes with the last of it)")
    elif status == "running":
        state = "running"
    elif status == "exited":
        state = f"exited with code {p.get('exit_code')}"
    elif status == "signalled":
        state = f"ended by signal {p.get('signal')}"
    elif status == "timed_out":
        state = f"killed at its timeout ({p.get('timeout') or 0:g} s)"
    else:
        state = f"lost ({p.get('error') or 'its box ended'})"
    command = p.get("command", "")
    return f"pid {p.get('pid')} {state}: {command[:200]}{' ...' if len(command) > 200 else ''}"


def process_result(p: dict[str, Any], session_id: str, notes: list[str] | None = None) -> types.CallToolResult:
    """A background process and the output one read took (``stdout``/``stderr`` with their offsets,
    when read): the output, then how to read on (the offsets to send next), then notes."""
    lines = [process_state(p)]
    if "stdout_offset" in p:
        shown = [s for s in ("stdout", "stderr") if p.get(s)]
        lines += [f"{s}:\n{p[s]}" for s in shown] or ["(no new output)"]
        for s in ("stdout", "stderr"):
            dropped = int(p.get(f"{s}_dropped") or 0)
            if dropped:  # an ended process keeps only the tail of what nobody read
                lines.append(f"[{dropped} bytes of {s} before this were never read and are gone: an ended "
                             "process keeps only the last part of its unread output]")
            if int(p.get(f"{s}_skipped") or 0) > dropped:
                lines.append(f"[{p[f'{s}_skipped'] - dropped} bytes of {s} before this were already read and "
                             "dropped]")
            if p.get(f"{s}_waiting"):
                lines.append(f"[{p[f'{s}_waiting']} more bytes of {s} are waiting: read on]")
        if p.get("running") or p.get("stdout_waiting") or p.get("stderr_waiting"):
            lines.append(f"next read: read_process_output pid={p.get('pid')} stdout_offset={p['stdout_offset']} "
                         f"stderr_offset={p['stderr_offset']}")
    lines += [f"note: {n}" for n in notes or []]
    lines.append(f"session_id: {session_id}")
    return data_result("\n".join(lines), {**p, "session_id": session_id, **({"notes": notes} if notes else {})})
