"""The MCP tools: JSON schemas and descriptions written for a model, and their handlers.

Each handler takes the tenant-scoped core, the caller, the key of the client's implicit session
and the validated arguments, and returns a CallToolResult; SB errors become tool errors in server.py.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import mcp_types as types

from ..agent.search import MAX_LINE_CHARS as GREP_LINE_CHARS
from ..errors import InvalidConfigError, SandboxError
from ..models import FileInfo, GlobResult, GrepResult, Language
from ..service.sessions import NAME_PATTERN
from .budget import cap_page, fit, left_out, line_chars
from .core import Caller, ServiceCore
from .process_tools import PROCESS_TOOLS
from .results import data_result, execution_result, file_uri
from .tool_base import PATH, RUN_HANDLE, SESSION_ID, TIMEOUT, ToolDef, current_session, existing_session, obj


def run_code(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = existing_session(core, caller, key, args)
    timeout, capped = core.timeout(args.get("timeout"))
    context_id = args.get("context_id")
    language = args.get("language", "python")
    if context_id is None and Language.parse(language) in (Language.PYTHON, Language.BASH):
        context_id = "mcp"  # Python globals, the shell's variables and cd persist across calls
    result = core.run_code(caller, sid, args["code"], language, timeout, args.get("arguments"), context_id,
                           RUN_HANDLE.get())
    return execution_result(result, sid, [f"timeout capped to {timeout:g} s"] if capped else None, core.max_output,
                            core.max_resource_bytes)


def run_command(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = existing_session(core, caller, key, args)
    timeout, capped = core.timeout(args.get("timeout"))
    result = core.run_command(caller, sid, args["command"], timeout, args.get("cwd"), RUN_HANDLE.get())
    return execution_result(result, sid, [f"timeout capped to {timeout:g} s"] if capped else None, core.max_output,
                            core.max_resource_bytes)


def interrupt_run(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = current_session(core, caller, key, args)
    done = sid is not None and core.interrupt(caller, sid)
    if done:
        text = (f"interrupted the run in session {sid}; its run_code or run_command call ends now (a Python or "
                "JavaScript context keeps its state)")
    else:
        text = f"nothing was running in session {sid}" if sid else "nothing was running: no session yet"
    return data_result(text, {"session_id": sid, "interrupted": done})


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
    sid = existing_session(core, caller, key, args)
    offset, char_offset = args.get("offset", 0), args.get("char_offset", 0)
    try:
        page = core.read_file(caller, sid, args["path"], offset, args.get("limit", 2000))
    except SandboxError as e:
        if e.details.get("reason") != "binary":
            raise
        uri = file_uri(sid, args["path"])  # MCP has no read_binary tool: its bytes are a resource
        raise InvalidConfigError(f"{args['path']!r} looks binary: read it as the resource {uri} (resources/read, "
                                 f"files of at most {core.max_resource_bytes} bytes)",
                                 details={**e.details, "resource": uri}) from None
    budget = core.max_output  # a page holds at most this many characters, a line at most max_line_chars
    shown = cap_page(page.content, page.offset, budget, line_chars(budget, args.get("max_line_chars")),
                     char_offset)
    out: dict[str, Any] = {**page.to_dict(), "content": shown.content, "session_id": sid}
    if char_offset:
        out["char_offset"] = char_offset
    more = ""  # at most one note, and it is the exact next call
    if shown.cut_lines:  # the page ends in a line shown in part: its marker (shown.text) says how to read on
        out.update(truncated=True, next_offset=shown.next_offset, next_char_offset=shown.next_char_offset,
                   cut_lines=shown.cut_lines)
    elif shown.next_offset is not None:
        out.update(truncated=True, next_offset=shown.next_offset)
        more = (f"\n[lines {page.offset + 1}-{shown.next_offset} of {page.total_lines} shown: a reply holds at most "
                f"{budget} characters; read on with offset={shown.next_offset}]")
    elif page.truncated:
        out["next_offset"] = page.offset + max(page.content.count("\n"), 1)
        more = (f"\n[lines {page.offset + 1}-{out['next_offset']} of {page.total_lines}; "
                f"read more with offset={out['next_offset']}]")
    if shown.cut_lines or shown.next_offset is not None:
        out["output_capped"] = {"content": {"characters": shown.characters, "shown": len(shown.content),
                                            "limit": budget}}
    return data_result(shown.text + more, out)


def write_file(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = existing_session(core, caller, key, args)
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


def delete_file(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = existing_session(core, caller, key, args)
    core.delete_path(caller, sid, args["path"])
    return data_result(f"deleted {args['path']}", {"path": args["path"], "deleted": True, "session_id": sid})


def create_directory(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = existing_session(core, caller, key, args)
    created = core.make_dir(caller, sid, args["path"])
    text = f"created directory {args['path']}" if created else f"{args['path']} was a directory already"
    return data_result(text, {"path": args["path"], "created": created, "session_id": sid})


def move_file(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = existing_session(core, caller, key, args)
    where = core.move_path(caller, sid, args["source"], args["destination"])
    return data_result(f"moved {args['source']} to {where}", {"source": args["source"], "path": where,
                                                               "session_id": sid})


def list_files(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = existing_session(core, caller, key, args)
    found = core.list_files(caller, sid, args.get("path", "."), bool(args.get("recursive", False)))
    lines, n = fit(found, lambda f: f"{f.path}{'/' if f.is_dir else ''}\t{f.size}", FileInfo.to_dict,
                   core.max_output)
    out: dict[str, Any] = {"files": [f.to_dict() for f in found[:n]], "session_id": sid}
    if n < len(found):
        lines.append(left_out(len(found) - n, len(found), "entries", core.max_output,
                              "list one subdirectory at a time (path), leave recursive out, or match names "
                              "with glob"))
        out.update(truncated=True, total=len(found), omitted=len(found) - n)
    return data_result("\n".join(lines) or "(empty)", out)


SKIP_REASONS = {"unreadable": "could not be read", "not_regular": "not a regular file (FIFO, socket or device)",
                "long_line": "a line over 8 MiB was searched in 8 MiB pieces; a match across two is missed"}


def _notes(truncated: bool, limit: int, what: str, skipped_names: int) -> list[str]:
    notes = [f"[{what} truncated at {limit}; narrow the pattern or raise max_results]"] if truncated else []
    if skipped_names:
        notes.append(f"[{skipped_names} names that are not valid UTF-8 were left out]")
    return notes


def glob(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = existing_session(core, caller, key, args)
    limit = args.get("max_results", 1000)
    paths = core.glob(caller, sid, args["pattern"], limit)
    found = paths if isinstance(paths, GlobResult) else GlobResult(paths)
    lines, n = fit(found, str, str, core.max_output)
    out: dict[str, Any] = {**found.to_dict(), "paths": list(found[:n]), "session_id": sid}
    notes = _notes(found.truncated, limit, "results", found.skipped_names)
    if n < len(found):
        notes.append(left_out(len(found) - n, len(found), "paths", core.max_output,
                              "narrow the pattern (e.g. a directory at a time)"))
        out.update(omitted=len(found) - n)
    return data_result("\n".join((lines or ["(no match)"]) + notes), out)


def grep(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = existing_session(core, caller, key, args)
    limit = args.get("max_results", 100)
    hits = core.grep(caller, sid, args["pattern"], args.get("path", "."), args.get("glob"), limit)
    found = hits if isinstance(hits, GrepResult) else GrepResult(hits)
    entries: list[tuple[str, Any]] = [*(("match", m) for m in found), *(("binary", p) for p in found.binary_matches),
                                      *(("skipped", s) for s in found.skipped)]

    def render(entry: tuple[str, Any]) -> str:
        kind, v = entry
        if kind == "match":
            cut = (f" [... the line goes on: read it with read_file path={v.path} offset={v.line_number - 1} "
                   f"char_offset={len(v.line)}]" if len(v.line) >= GREP_LINE_CHARS else "")
            return f"{v.path}:{v.line_number}: {v.line}{cut}"
        if kind == "binary":
            return f"Binary file {v} matches (its lines are not shown)"
        return f"[skipped {v['path']}: {SKIP_REASONS.get(v['reason'], v['reason'])}]"

    def data(entry: tuple[str, Any]) -> Any:
        return entry[1].to_dict() if entry[0] == "match" else entry[1]

    lines, n = fit(entries, render, data, core.max_output)
    kept = entries[:n]
    shown = GrepResult([v for k, v in kept if k == "match"], truncated=found.truncated,
                       binary_matches=[v for k, v in kept if k == "binary"],
                       skipped=[v for k, v in kept if k == "skipped"], skipped_names=found.skipped_names)
    matched = [ln for (k, _), ln in zip(kept, lines, strict=True) if k == "match"]
    binary = [ln for (k, _), ln in zip(kept, lines, strict=True) if k == "binary"]
    skipped = [ln for (k, _), ln in zip(kept, lines, strict=True) if k == "skipped"]
    notes = _notes(found.truncated, limit, "results", found.skipped_names) + skipped
    out: dict[str, Any] = {**shown.to_dict(), "session_id": sid}
    if n < len(entries):
        notes.append(left_out(len(entries) - n, len(entries), "results (matching lines, binary files, skipped "
                              "files)", core.max_output, "narrow the pattern, path or glob"))
        out.update(omitted=len(entries) - n)
    return data_result("\n".join((matched + binary or ["(no match)"]) + notes), out)


def install_packages(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = existing_session(core, caller, key, args)
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
            obj({"code": {"type": "string", "minLength": 1, "description": "The program to run."},
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
            "the background end with it: start servers and other long-lived commands with start_process.",
            obj({"command": {"type": "string", "minLength": 1}, "session_id": SESSION_ID,
                  "cwd": {**PATH, "description": "Workspace-relative directory to run in."}, "timeout": TIMEOUT},
                 ["command"]),
            run_command),
    ToolDef("interrupt_run", "Interrupt a run",
            "Stop the run_code or run_command call now running in a session (e.g. one stuck in a loop), as "
            "a notebook's interrupt: that call returns at once marked interrupted, and a Python or JavaScript "
            "context keeps its state. Background processes are not affected (use kill_process).",
            obj({"session_id": SESSION_ID}), interrupt_run, destructive=True),
    *PROCESS_TOOLS,
    ToolDef("create_session", "Create a session",
            "Create a new sandbox session: a private workspace whose files and Python globals persist until "
            "close_session. You rarely need this: tools without session_id use this conversation's session.",
            obj({"session_id": {**SESSION_ID, "description": "Id to give the session (default: generated)."}}),
            create_session, idempotent=True),
    ToolDef("close_session", "Close a session",
            "Close a session: stop everything running in it and DELETE its workspace and files.",
            obj({"session_id": {**SESSION_ID, "description": "The session to close."}}, ["session_id"]),
            close_session, destructive=True),
    ToolDef("list_sessions", "List sessions", "List this tenant's open sandbox sessions.",
            obj({}), list_sessions, read_only=True, idempotent=True),
    ToolDef("read_file", "Read a text file",
            "Read a text file from the workspace, paged by lines (offset is 0-based). One reply holds a "
            "limited number of characters and each line at most max_line_chars: when a page or a line is cut, "
            "the reply names the offset (and, inside a long line, the char_offset) that reads on.",
            obj({"path": PATH, "session_id": SESSION_ID,
                  "offset": {"type": "integer", "minimum": 0, "default": 0},
                  "limit": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 2000},
                  "char_offset": {"type": "integer", "minimum": 0, "default": 0,
                                  "description": "Start the first line (line `offset`) at this character: "
                                                 "reads on in a line that was cut (the reply names the value)."},
                  "max_line_chars": {"type": "integer", "minimum": 1, "maximum": 1000000,
                                     "description": "Characters of each line to show (default 2000; at most "
                                                    "what one reply holds); a longer line is cut with a note "
                                                    "naming the char_offset that reads on."}}, ["path"]),
            read_file, read_only=True, idempotent=True),
    ToolDef("write_file", "Write a file",
            "Write a file into the workspace atomically (parent directories are created). Text by default; "
            "set encoding='base64' for binary content. mode 'append' adds to an existing file. Over HTTP "
            "one call holds at most the server's request limit (4 MiB by default, base64 included; a larger "
            "call is refused with SB002 naming it): write a larger file in pieces, the first with mode "
            "'overwrite' and the rest with mode 'append' (cut base64 text at a multiple of 4 characters).",
            obj({"path": PATH, "content": {"type": "string"}, "session_id": SESSION_ID,
                  "encoding": {"type": "string", "enum": ["utf-8", "base64"], "default": "utf-8"},
                  "mode": {"type": "string", "enum": ["overwrite", "append"], "default": "overwrite"}},
                 ["path", "content"]),
            write_file, destructive=True),
    ToolDef("delete_file", "Delete a file or directory",
            "Delete a workspace file, or a directory with everything in it (a symlink itself, never its target).",
            obj({"path": PATH, "session_id": SESSION_ID}, ["path"]), delete_file, destructive=True),
    ToolDef("create_directory", "Create a directory",
            "Create a workspace directory and its missing parents (no error if it exists).",
            obj({"path": PATH, "session_id": SESSION_ID}, ["path"]), create_directory, idempotent=True),
    ToolDef("move_file", "Move or rename",
            "Move or rename a workspace file or directory to the destination path (the full new path, not a "
            "folder to move into; missing parents are created and a file already there is replaced).",
            obj({"source": PATH, "destination": PATH, "session_id": SESSION_ID}, ["source", "destination"]),
            move_file, destructive=True),
    ToolDef("list_files", "List files",
            "List a workspace directory (recursively if asked). A long listing is cut at what one reply holds: "
            "the reply says how many entries were left out; list a subdirectory or use glob to narrow it.",
            obj({"path": {**PATH, "default": "."}, "recursive": {"type": "boolean", "default": False},
                  "session_id": SESSION_ID}),
            list_files, read_only=True, idempotent=True),
    ToolDef("glob", "Find files by pattern",
            "Find workspace paths matching a glob such as '**/*.py' (at most max_results; the reply says when "
            "more matched).",
            obj({"pattern": {"type": "string", "minLength": 1, "maxLength": 4096},
                  "max_results": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000},
                  "session_id": SESSION_ID},
                 ["pattern"]),
            glob, read_only=True, idempotent=True),
    ToolDef("grep", "Search file contents",
            "Search workspace files (any size) for a Python regular expression; returns path, line number and "
            "line for each matching line, names binary files that match, and says when results were truncated "
            "at max_results or a file could not be searched.",
            obj({"pattern": {"type": "string", "minLength": 1, "maxLength": 4096},
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
            obj({"pip": {"type": "array", "items": {"type": "string", "maxLength": 200}, "maxItems": 50},
                  "npm": {"type": "array", "items": {"type": "string", "maxLength": 200}, "maxItems": 50},
                  "session_id": SESSION_ID}),
            install_packages),
]

BY_NAME = {t.name: t for t in TOOLS}
