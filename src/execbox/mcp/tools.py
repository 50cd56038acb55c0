"""The MCP tools: JSON schemas and descriptions written for a model, and their handlers.

Each handler takes the tenant-scoped core, the caller, the key of the client's implicit session
and the validated arguments, and returns a CallToolResult; SB errors become tool errors in server.py.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from ..errors import InvalidConfigError, SandboxError
from ..models import GlobResult, GrepResult, Language
from ..service.sessions import NAME_PATTERN
from .core import Caller, ServiceCore
from .results import data_result, execution_result, file_uri

SESSION_ID = {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
              "description": "An execbox session id from create_session or list_sessions. Omit it to use "
                             "this conversation's own session, created on first use."}
PATH = {"type": "string", "minLength": 1, "maxLength": 4096,
        "description": "Workspace-relative path, e.g. 'data/input.csv'. Absolute paths, '..' and symlinks "
                       "leaving the workspace are refused."}
TIMEOUT = {"type": "number", "exclusiveMinimum": 0, "maximum": 3600,
           "description": "Seconds before the run is stopped (capped by the server's limit). A context cell past "
                          "it is interrupted and keeps its state; one that will not stop is killed."}

Handler = Callable[[ServiceCore, Caller, str, dict[str, Any]], types.CallToolResult]


@dataclass(frozen=True)
class ToolDef:
    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    handler: Handler
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False

    def to_tool(self) -> types.Tool:
        return types.Tool(name=self.name, title=self.title, description=self.description,
                          input_schema=self.input_schema,
                          annotations=types.ToolAnnotations(title=self.title, read_only_hint=self.read_only,
                                                            destructive_hint=self.destructive,
                                                            idempotent_hint=self.idempotent,
                                                            open_world_hint=False))


def _obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required or [],
            "additionalProperties": False}


def _existing(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> str:
    """The session a tool acts on: the one named (it must exist), else the conversation's own."""
    sid = args.get("session_id")
    if sid:
        core.require_session(caller, sid)
        return sid
    return core.implicit_session(caller, key)


def run_code(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = _existing(core, caller, key, args)
    timeout, capped = core.timeout(args.get("timeout"))
    context_id = args.get("context_id")
    language = args.get("language", "python")
    if context_id is None and Language.parse(language) in (Language.PYTHON, Language.BASH):
        context_id = "mcp"  # Python globals, the shell's variables and cd persist across calls
    result = core.run_code(caller, sid, args["code"], language, timeout, args.get("arguments"), context_id)
    return execution_result(result, sid, [f"timeout capped to {timeout:g} s"] if capped else None, core.max_output)


def run_command(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = _existing(core, caller, key, args)
    timeout, capped = core.timeout(args.get("timeout"))
    result = core.run_command(caller, sid, args["command"], timeout, args.get("cwd"))
    return execution_result(result, sid, [f"timeout capped to {timeout:g} s"] if capped else None, core.max_output)


def create_session(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    info = core.create_session(caller, args.get("session_id"))
    return data_result(f"session_id: {info['session_id']}", {"session": info})


def close_session(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    info = core.close_session(caller, args["session_id"])
    return data_result(f"closed session {args['session_id']}; its workspace was deleted", {"session": info})


def list_sessions(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    found = core.list_sessions(caller)
    text = "\n".join(f"{s['session_id']} (idle {s['idle_seconds']} s)" for s in found) or "no sessions"
    return data_result(text, {"sessions": found})


def read_file(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = _existing(core, caller, key, args)
    try:
        page = core.read_file(caller, sid, args["path"], args.get("offset", 0), args.get("limit", 2000))
    except SandboxError as e:
        if e.details.get("reason") != "binary":
            raise
        uri = file_uri(sid, args["path"])  # MCP has no read_binary tool: its bytes are a resource
        raise InvalidConfigError(f"{args['path']!r} looks binary: read it as the resource {uri} (resources/read)",
                                 details={**e.details, "resource": uri}) from None
    d = page.to_dict()
    more = (f"\n[lines {page.offset + 1}-{page.offset + page.limit} of {page.total_lines}; "
            f"read more with offset={page.offset + page.limit}]" if page.truncated else "")
    return data_result(page.content + more, {**d, "session_id": sid})


def write_file(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = _existing(core, caller, key, args)
    content: str | bytes
    if args.get("encoding", "utf-8") == "base64":
        try:
            content = base64.b64decode(args["content"], validate=True)
        except (binascii.Error, ValueError):
            raise InvalidConfigError("content is not valid base64", details={"field": "content"}) from None
    else:
        content = args["content"]
    info = core.write_file(caller, sid, args["path"], content, args.get("mode", "overwrite"))
    return data_result(f"wrote {info.path} ({info.size} bytes)", {**info.to_dict(), "session_id": sid})


def list_files(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = _existing(core, caller, key, args)
    found = core.list_files(caller, sid, args.get("path", "."), bool(args.get("recursive", False)))
    text = "\n".join(f"{f.path}{'/' if f.is_dir else ''}\t{f.size}" for f in found) or "(empty)"
    return data_result(text, {"files": [f.to_dict() for f in found], "session_id": sid})


SKIP_REASONS = {"unreadable": "could not be read", "not_regular": "not a regular file (FIFO, socket or device)",
                "long_line": "a line over 8 MiB was searched in 8 MiB pieces; a match across two is missed"}


def _notes(truncated: bool, limit: int, what: str, skipped_names: int) -> list[str]:
    notes = [f"[{what} truncated at {limit}; narrow the pattern or raise max_results]"] if truncated else []
    if skipped_names:
        notes.append(f"[{skipped_names} names that are not valid UTF-8 were left out]")
    return notes


def glob(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = _existing(core, caller, key, args)
    limit = args.get("max_results", 1000)
    paths = core.glob(caller, sid, args["pattern"], limit)
    found = paths if isinstance(paths, GlobResult) else GlobResult(paths)
    text = "\n".join(([*found] or ["(no match)"]) + _notes(found.truncated, limit, "results", found.skipped_names))
    return data_result(text, {**found.to_dict(), "session_id": sid})


def grep(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = _existing(core, caller, key, args)
    limit = args.get("max_results", 100)
    hits = core.grep(caller, sid, args["pattern"], args.get("path", "."), args.get("glob"), limit)
    found = hits if isinstance(hits, GrepResult) else GrepResult(hits)
    lines = [f"{m.path}:{m.line_number}: {m.line}" for m in found]
    lines += [f"Binary file {p} matches (its lines are not shown)" for p in found.binary_matches]
    notes = _notes(found.truncated, limit, "results", found.skipped_names)
    notes += [f"[skipped {s['path']}: {SKIP_REASONS.get(s['reason'], s['reason'])}]" for s in found.skipped]
    return data_result("\n".join((lines or ["(no match)"]) + notes), {**found.to_dict(), "session_id": sid})


def install_packages(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = _existing(core, caller, key, args)
    out = core.install(caller, sid, list(args.get("pip") or []), list(args.get("npm") or []))
    names = " ".join([*out["pip"], *out["npm"]])
    return data_result(f"installed {names} ({out['bytes']} bytes) into session {sid}", {**out, "session_id": sid})


TOOLS: list[ToolDef] = [
    ToolDef("run_code", "Run code",
            "Run Python, JavaScript (Node.js) or bash code in an isolated sandbox and return stdout, stderr, "
            "the exit code and, when the code defines main(), main's JSON return value. Python globals persist "
            "across run_code calls in the same session (a Jupyter-like context), so define data once and reuse "
            "it; so do a bash shell's variables, functions and working directory (cd carries over). matplotlib "
            "figures come back as PNG images; files written under artifacts/ come back as resources. The "
            "sandbox has no network access unless the operator allows it.",
            _obj({"code": {"type": "string", "minLength": 1, "description": "The program to run."},
                  "language": {"type": "string", "enum": ["python", "javascript", "bash"], "default": "python"},
                  "session_id": SESSION_ID,
                  "context_id": {"type": "string", "maxLength": 64, "pattern": NAME_PATTERN,
                                 "description": "Context whose state persists: Python or JavaScript globals, "
                                                "a bash shell's variables and working directory (default for "
                                                "Python and bash: the session's own; JavaScript without one "
                                                "starts fresh each call). Use another id for a fresh one."},
                  "timeout": TIMEOUT,
                  "arguments": {"type": "object", "description": "Keyword arguments for main(**arguments) "
                                                                 "(Python) or main(arguments) (JavaScript)."}},
                 ["code"]),
            run_code),
    ToolDef("run_command", "Run a shell command",
            "Run a bash command line in the session's workspace (e.g. 'ls -la', 'python3 script.py', "
            "'grep -r TODO .') and return its stdout, stderr and exit code. Processes it leaves running in "
            "the background end with it.",
            _obj({"command": {"type": "string", "minLength": 1}, "session_id": SESSION_ID,
                  "cwd": {**PATH, "description": "Workspace-relative directory to run in."}, "timeout": TIMEOUT},
                 ["command"]),
            run_command),
    ToolDef("create_session", "Create a session",
            "Create a new sandbox session: a private workspace whose files and Python globals persist until "
            "close_session. You rarely need this: tools without session_id use this conversation's session.",
            _obj({"session_id": {**SESSION_ID, "description": "Id to give the session (default: generated)."}}),
            create_session, idempotent=True),
    ToolDef("close_session", "Close a session",
            "Close a session: stop everything running in it and DELETE its workspace and files.",
            _obj({"session_id": {**SESSION_ID, "description": "The session to close."}}, ["session_id"]),
            close_session, destructive=True),
    ToolDef("list_sessions", "List sessions", "List this tenant's open sandbox sessions.",
            _obj({}), list_sessions, read_only=True, idempotent=True),
    ToolDef("read_file", "Read a text file",
            "Read a text file from the workspace, paged by lines (offset is 0-based). Large files: read the "
            "next page with the offset the reply gives.",
            _obj({"path": PATH, "session_id": SESSION_ID,
                  "offset": {"type": "integer", "minimum": 0, "default": 0},
                  "limit": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 2000}}, ["path"]),
            read_file, read_only=True, idempotent=True),
    ToolDef("write_file", "Write a file",
            "Write a file into the workspace atomically (parent directories are created). Text by default; "
            "set encoding='base64' for binary content. mode 'append' adds to an existing file.",
            _obj({"path": PATH, "content": {"type": "string"}, "session_id": SESSION_ID,
                  "encoding": {"type": "string", "enum": ["utf-8", "base64"], "default": "utf-8"},
                  "mode": {"type": "string", "enum": ["overwrite", "append"], "default": "overwrite"}},
                 ["path", "content"]),
            write_file, destructive=True),
    ToolDef("list_files", "List files", "List a workspace directory (recursively if asked).",
            _obj({"path": {**PATH, "default": "."}, "recursive": {"type": "boolean", "default": False},
                  "session_id": SESSION_ID}),
            list_files, read_only=True, idempotent=True),
    ToolDef("glob", "Find files by pattern",
            "Find workspace paths matching a glob such as '**/*.py' (at most max_results; the reply says when "
            "more matched).",
            _obj({"pattern": {"type": "string", "minLength": 1, "maxLength": 4096},
                  "max_results": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000},
                  "session_id": SESSION_ID},
                 ["pattern"]),
            glob, read_only=True, idempotent=True),
    ToolDef("grep", "Search file contents",
            "Search workspace files (any size) for a Python regular expression; returns path, line number and "
            "line for each matching line, names binary files that match, and says when results were truncated "
            "at max_results or a file could not be searched.",
            _obj({"pattern": {"type": "string", "minLength": 1, "maxLength": 4096},
                  "path": {**PATH, "default": "."},
                  "glob": {"type": "string", "maxLength": 4096, "description": "Only files matching this glob."},
                  "max_results": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 100},
                  "session_id": SESSION_ID},
                 ["pattern"]),
            grep, read_only=True, idempotent=True),
    ToolDef("install_packages", "Install packages",
            "Install Python (pip) and/or Node.js (npm) packages into the session's workspace from the "
            "operator's package index, so later run_code calls can import/require them. Only the index is "
            "reachable while installing. Give plain names with optional versions, e.g. 'httpx>=0.27', 'axios'.",
            _obj({"pip": {"type": "array", "items": {"type": "string", "maxLength": 200}, "maxItems": 50},
                  "npm": {"type": "array", "items": {"type": "string", "maxLength": 200}, "maxItems": 50},
                  "session_id": SESSION_ID}),
            install_packages),
]

BY_NAME = {t.name: t for t in TOOLS}
