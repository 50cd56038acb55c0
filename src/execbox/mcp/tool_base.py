"""What every MCP tool module shares: the tool record, schema pieces, and which session a call acts on."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from ..service.sessions import NAME_PATTERN
from ..service.streaming import RunHandle
from .core import Caller, ServiceCore

SESSION_ID = {"type": "string", "maxLength": 64, "pattern": NAME_PATTERN,  # exactly the HTTP API's session ids
              "description": "An execbox session id from create_session or list_sessions. Omit it to use "
                             "this conversation's own session, created on first use."}
PATH = {"type": "string", "minLength": 1, "maxLength": 4096,
        "description": "Workspace-relative path, e.g. 'data/input.csv'. Absolute paths, '..' and symlinks "
                       "leaving the workspace are refused."}
TIMEOUT = {"type": "number", "exclusiveMinimum": 0, "maximum": 3600,
           "description": "Seconds before the run is stopped (capped by the server's limit). A context cell past "
                          "it is interrupted and keeps its state; one that will not stop is killed."}

Handler = Callable[[ServiceCore, Caller, str, dict[str, Any]], types.CallToolResult]

RUN_HANDLE: ContextVar[RunHandle | None] = ContextVar("execbox_mcp_run_handle", default=None)
"""The handle of the tool call running in this thread (server.py): cancelling the call (the client's
``notifications/cancelled``, or a sessionless client closing its stream) stops the run it started."""


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


def obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """An input schema: these properties, these required, nothing else."""
    return {"type": "object", "properties": properties, "required": required or [],
            "additionalProperties": False}


def existing_session(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> str:
    """The session a tool acts on: the one named (it must exist), else the conversation's own."""
    sid = args.get("session_id")
    if sid:
        core.require_session(caller, sid)
        return sid
    return core.implicit_session(caller, key)


def current_session(core: ServiceCore, caller: Caller, key: str, args: dict[str, Any]) -> str | None:
    """As ``existing_session``, but None where the conversation has no session yet: a tool that only
    looks at what runs (list, read, kill, interrupt) must not start a box to find nothing there."""
    sid = args.get("session_id")
    if sid:
        core.require_session(caller, sid)
        return sid
    return core.current_implicit(caller, key)
