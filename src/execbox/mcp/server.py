"""The MCP server: tool listing and dispatch, workspace files as resources, error mapping.

Transport-neutral: ``resolve(ctx)`` says which core, caller and implicit-session key a request
belongs to (stdio: the one local user; HTTP: the bearer token's tenant, see http.py).
"""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import anyio.to_thread
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError

from .. import __version__
from ..errors import SandboxError
from .arguments import check_arguments
from .core import Caller, ServiceCore
from .results import error_result, file_uri
from .tools import BY_NAME, TOOLS

log = logging.getLogger("execbox.mcp")

Resolver = Callable[[Any], tuple[ServiceCore, Caller, str]]
URI = re.compile(r"^execbox://sessions/(?P<sid>[^/]+)/files/(?P<path>.+)$")
MAX_LISTED_FILES = 500
TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript")

INSTRUCTIONS = (
    "execbox runs untrusted Python, JavaScript and bash in an isolated sandbox. Use run_code for programs "
    "(Python globals persist between calls), run_command for shell commands, and the file tools to read and "
    "write the workspace. Errors carry an SB code (SB005 timeout, SB006 out of memory, SB002 bad input).")


def build_server(resolve: Resolver) -> Server[Any]:
    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[t.to_tool() for t in TOOLS])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = BY_NAME.get(params.name)
        if tool is None:  # a protocol error, as the MCP spec has it (bad arguments are tool errors)
            raise MCPError(code=types.INVALID_PARAMS, message=f"unknown tool {params.name[:100]!r}",
                           data={"tools": sorted(BY_NAME)})
        try:
            core, caller, key = resolve(ctx)
            args = check_arguments(tool.name, tool.input_schema, params.arguments)  # SB002 naming the field
            return await anyio.to_thread.run_sync(tool.handler, core, caller, key, args)
        except SandboxError as e:
            return error_result(e)
        except Exception as e:  # noqa: BLE001 - a tool failure must never take the connection down
            log.exception("mcp tool %s failed", params.name)
            return error_result(SandboxError(f"internal error in {params.name}: {type(e).__name__}"))

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        core, caller, _ = resolve(ctx)
        return types.ListResourcesResult(resources=await anyio.to_thread.run_sync(_list_files, core, caller))

    async def list_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
            name="workspace-file", title="Workspace file",
            uri_template="execbox://sessions/{session_id}/files/{path}",
            description="A file in one of your sessions' workspaces (artifacts included).")])

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        core, caller, _ = resolve(ctx)
        uri = str(params.uri)
        m = URI.match(uri)
        if m is None:
            raise MCPError(code=types.INVALID_PARAMS,
                           message=f"not an execbox resource: {uri!r} (execbox://sessions/<id>/files/<path>)")
        sid, path = unquote(m.group("sid")), unquote(m.group("path"))
        try:
            data = await anyio.to_thread.run_sync(core.read_bytes, caller, sid, path)
        except SandboxError as e:
            raise MCPError(code=types.INVALID_PARAMS, message=f"{e.code}: {e.message}") from None
        mime = _mime(path)
        if mime.startswith(TEXT_TYPES):
            try:
                return types.ReadResourceResult(contents=[types.TextResourceContents(
                    uri=uri, mime_type=mime, text=data.decode("utf-8"))])
            except UnicodeDecodeError:
                pass
        return types.ReadResourceResult(contents=[types.BlobResourceContents(
            uri=uri, mime_type=mime, blob=base64.b64encode(data).decode())])

    return Server("execbox", version=__version__, instructions=INSTRUCTIONS,
                  on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=list_resources,
                  on_list_resource_templates=list_templates, on_read_resource=read_resource)


def _mime(path: str) -> str:
    import mimetypes

    return mimetypes.guess_type(path)[0] or "application/octet-stream"


def _list_files(core: ServiceCore, caller: Caller) -> list[types.Resource]:
    out: list[types.Resource] = []
    for s in core.list_sessions(caller):
        sid = s["session_id"]
        if s.get("state") != "running":  # paused or not started: listing must not resume or start a box
            continue
        try:
            files = core.list_running_files(caller, sid)
        except SandboxError:
            continue
        if files is None:
            continue
        for f in files:
            if f.is_dir:
                continue
            out.append(types.Resource(name=f"{sid}/{f.path}", uri=file_uri(sid, f.path), size=f.size,
                                      mime_type=_mime(f.path)))
            if len(out) >= MAX_LISTED_FILES:
                return out
    return out
