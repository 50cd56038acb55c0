"""The MCP tools for background processes: start, list, read output, write stdin, kill.

The HTTP API's background processes (docs/http-api.md, "Background processes"), through
processes.py on the same process table. A process runs in the session's box beside runs and file
operations, so a model can start a dev server and query it with run_command.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types

from ..errors import InvalidConfigError
from ..service.background import SIGNALS
from . import processes
from .core import Caller, ServiceCore
from .results import data_result, process_result, process_state
from .tool_base import PATH, SESSION_ID, ToolDef, current_session, existing_session, obj

PID = {"type": "integer", "minimum": 1, "maximum": 2**31 - 1,
       "description": "The process's pid, from start_process or list_processes (its id in the session: its pid in "
                      "the box, box_pid, unless that number was taken)."}
OFFSET = {"type": "integer", "minimum": 0, "maximum": 2**62, "default": 0}
WAIT = {"type": "number", "minimum": 0, "maximum": processes.MAX_WAIT}


def _session(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> str:
    """The session a pid belongs to; a conversation without a session has no processes."""
    sid = current_session(core, caller, key, args)
    if sid is None:
        pid = args["pid"]
        raise InvalidConfigError(f"no background process {pid}: this conversation has no session yet",
                                 http_status=404, details={"field": "pid", "pid": pid})
    return sid


def start_process(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = existing_session(core, caller, key, args)
    proc = processes.start(core, caller, sid, args["command"], args.get("cwd"), args.get("env"),
                           bool(args.get("stdin", False)), args.get("timeout"))
    got = processes.read(proc, 0, 0, args.get("wait", 1.0), core.max_output)
    notes = None
    if got.get("exited_in_box"):  # over in the box while its output waits there (review 32, F7)
        notes = ["it has already exited in the box: read_process_output reads the rest of its output"]
    elif got["running"]:
        notes = ["it keeps running after this call: read_process_output reads its output, kill_process stops it"]
    if got["pid"] != got["box_pid"]:  # its pid in the box names another process here (one of an earlier box)
        notes = [*(notes or []), f"its pid in the box is {got['box_pid']}, but pid {got['box_pid']} in this session "
                                 f"names another process (of the session's earlier box): use pid={got['pid']}"]
    return process_result(got, sid, notes)


def list_processes(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = current_session(core, caller, key, args)
    found = [p.info() for p in processes.listing(core, caller, sid)] if sid is not None else []
    text = "\n".join(process_state(p) for p in found) or "no background processes"
    return data_result(text, {"processes": found, "session_id": sid})


def read_process_output(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = _session(core, caller, key, args)
    proc = processes.find(core, caller, sid, args["pid"])
    got = processes.read(proc, args.get("stdout_offset", 0), args.get("stderr_offset", 0), args.get("wait", 0.0),
                         core.max_output)
    return process_result(got, sid)


def write_process_input(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = _session(core, caller, key, args)
    out = processes.write_input(core, caller, sid, args["pid"], args.get("data"), args.get("encoding", "utf-8"),
                                bool(args.get("close", False)))
    text = f"wrote {out['written']} bytes to the stdin of pid {out['pid']}"
    if args.get("close"):
        text += "; its stdin is closed (it reads end-of-file)"
    return data_result(text, {**out, "session_id": sid})


def kill_process(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> types.CallToolResult:
    sid = _session(core, caller, key, args)
    sig = args.get("signal", "SIGTERM")
    proc, signalled = processes.signal(core, caller, sid, args["pid"], sig)
    info = proc.info()
    if not signalled and not info["running"]:
        note = "it had already ended"
    elif info["running"]:
        note = f"sent {sig}; it is still running" + ("" if sig == "SIGKILL" else ": send SIGKILL to force it")
    else:
        note = f"sent {sig}; it has ended"
    return process_result(info, sid, [note])


SIGNAL = {"type": "string", "enum": list(SIGNALS), "default": "SIGTERM",
          "description": "SIGTERM asks it to stop; SIGKILL kills its whole process tree at once; SIGINT is Ctrl-C."}

PROCESS_TOOLS: list[ToolDef] = [
    ToolDef("start_process", "Start a background process",
            "Start a long-running bash command in the background (a dev server, a watcher, a long job) and "
            "return its pid and first output at once. It runs beside later calls in the same session (reach a "
            "server on 127.0.0.1:PORT with run_command) until it exits, kill_process, its timeout, or the "
            "session ends.",
            obj({"command": {"type": "string", "minLength": 1}, "session_id": SESSION_ID,
                 "cwd": {**PATH, "description": "Workspace-relative directory to run in."},
                 "env": {"type": "object", "additionalProperties": {"type": "string"},
                         "description": "Extra environment variables."},
                 "stdin": {"type": "boolean", "default": False,
                           "description": "Keep stdin open for write_process_input (else it reads end-of-file)."},
                 "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": processes.MAX_TIMEOUT,
                             "description": "Seconds after which it is killed (default: none)."},
                 "wait": {**WAIT, "default": 1, "description": "Seconds to wait for its first output."}},
                ["command"]),
            start_process),
    ToolDef("list_processes", "List background processes",
            "List the session's background processes (running and recently ended) with pid, status and command.",
            obj({"session_id": SESSION_ID}), list_processes, read_only=True, idempotent=True),
    ToolDef("read_process_output", "Read background process output",
            "Read a background process's new stdout/stderr and its status. Pass the stdout_offset and "
            "stderr_offset the previous reply gave to get only what came since; wait long-polls for new output.",
            obj({"pid": PID, "session_id": SESSION_ID, "stdout_offset": OFFSET, "stderr_offset": OFFSET,
                 "wait": {**WAIT, "default": 0, "description": "Seconds to wait when there is no new output yet."}},
                ["pid"]),
            read_process_output, read_only=True),
    ToolDef("write_process_input", "Write to a background process",
            "Write to the stdin of a background process started with stdin=true; close=true closes its stdin "
            "afterwards (or alone). Include the newline a line-reading program needs.",
            obj({"pid": PID, "data": {"type": "string"}, "session_id": SESSION_ID,
                 "encoding": {"type": "string", "enum": ["utf-8", "base64"], "default": "utf-8"},
                 "close": {"type": "boolean", "default": False}},
                ["pid"]),
            write_process_input),
    ToolDef("kill_process", "Stop a background process",
            "Send a signal (SIGTERM by default) to a background process and its children, wait briefly for it "
            "to end and say whether it did.",
            obj({"pid": PID, "signal": SIGNAL, "session_id": SESSION_ID}, ["pid"]),
            kill_process, destructive=True),
]
