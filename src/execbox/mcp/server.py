"""The MCP server: tool listing and dispatch, workspace files as resources, error mapping.

A ``resources/read`` reply carries at most ``EXECBOX_MCP_MAX_RESOURCE_BYTES`` of a file; a larger
file is refused with an error saying how to read it instead (resource_cap.py). A file comes back as
text when read_file would page it and it is UTF-8 (``looks_text``), whatever its name; otherwise as
a base64 blob. ``resources/list`` offers only what a read can read (resource_list.py: regular files,
no symlink that leads out of the workspace), with bounded work.

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
from ..service.executions import ClientGone
from ..service.streaming import RunHandle
from .arguments import check_arguments
from .budget import cap_result
from .core import Caller, ServiceCore
from .output_cap import DEFAULT_MAX_OUTPUT
from .resource_cap import looks_text, too_large
from .resource_list import Steps, iter_readable
from .results import error_result, file_uri
from .tool_base import RUN_HANDLE, Handler
from .tools import BY_NAME, TOOLS

log = logging.getLogger("execbox.mcp")

Resolver = Callable[[Any], tuple[ServiceCore, Caller, str]]
URI = re.compile(r"^execbox://sessions/(?P<sid>[^/]+)/files/(?P<path>.+)$")
MAX_LISTED_FILES = 500

INSTRUCTIONS = (
    "execbox runs untrusted Python, JavaScript and bash in an isolated sandbox. Use run_code for programs "
    "(Python globals persist between calls), run_command for shell commands, start_process for servers and "
    "other long-running commands, and the file tools to read and change the workspace. Errors carry an SB "
    "code (SB005 timeout, SB006 out of memory, SB002 bad input).")


def build_server(resolve: Resolver) -> Server[Any]:
    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[t.to_tool() for t in TOOLS])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = BY_NAME.get(params.name)
        if tool is None:  # a protocol error, as the MCP spec has it (bad arguments are tool errors)
            raise MCPError(code=types.INVALID_PARAMS, message=f"unknown tool {params.name[:100]!r}",
                           data={"tools": sorted(BY_NAME)})
        max_output = DEFAULT_MAX_OUTPUT
        try:
            core, caller, key = resolve(ctx)
            args = check_arguments(tool.name, tool.input_schema, params.arguments)  # SB002 naming the field
            max_output = core.max_output
            result = await _cancellable(tool.handler, core, caller, key, args)
        except SandboxError as e:
            result = error_result(e)
        except ClientGone:  # cancelled before its run started: nothing ran, and nobody waits for this answer
            result = error_result(SandboxError(f"{params.name} was cancelled before it started"))
        except Exception as e:  # noqa: BLE001 - a tool failure must never take the connection down
            log.exception("mcp tool %s failed", params.name)
            result = error_result(SandboxError(f"internal error in {params.name}: {type(e).__name__}"))
        return cap_result(result, max_output)  # the net under every tool's own caps (budget.py)

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
        return await anyio.to_thread.run_sync(_read_resource, core, caller, str(params.uri))

    return Server("execbox", version=__version__, instructions=INSTRUCTIONS,
                  on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=list_resources,
                  on_list_resource_templates=list_templates, on_read_resource=read_resource)


async def _cancellable(handler: Handler, core: ServiceCore, caller: Caller, key: str,
                       args: dict[str, Any]) -> types.CallToolResult:
    """``handler`` on a worker thread. When the call is cancelled while it works (the client's
    ``notifications/cancelled``, a sessionless client closing its response stream, the server
    stopping), the run it started is stopped (``RunHandle``: that run only, never the next one in
    the session; a run not started yet never starts) and the cancellation goes on once the thread
    returns. Other tools (file operations, installs) finish as they would have."""
    handle = RunHandle()
    box: dict[str, Any] = {}
    done = anyio.Event()

    def call() -> types.CallToolResult:
        token = RUN_HANDLE.set(handle)
        try:
            return handler(core, caller, key, args)
        finally:
            RUN_HANDLE.reset(token)
            handle.done.set()

    async def work() -> None:
        with anyio.CancelScope(shield=True):  # the thread is never abandoned: it ends, then we do
            try:
                box["value"] = await anyio.to_thread.run_sync(call)
            except BaseException as e:  # noqa: BLE001 - handed to the caller below
                box["error"] = e
            finally:
                done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(work)
        try:
            await done.wait()
        except anyio.get_cancelled_exc_class():
            handle.cancel()  # pokes the run's box until the worker returns (service/streaming.py)
            raise
    if "error" in box:
        raise box["error"]
    return box["value"]


def _mime(path: str) -> str:
    import mimetypes

    return mimetypes.guess_type(path)[0] or "application/octet-stream"


def _read_resource(core: ServiceCore, caller: Caller, uri: str) -> types.ReadResourceResult:
    """A workspace file whole, as text or base64, if it is within ``core.max_resource_bytes``;
    larger, an error naming its size, the limit and how to read it (resource_cap.py). At most the
    limit is read to decide: a ranged read that also tells the file's size."""
    m = URI.match(uri)
    if m is None:
        raise MCPError(code=types.INVALID_PARAMS,
                       message=f"SB002: not an execbox resource: {uri!r} (execbox://sessions/<id>/files/<path>)",
                       data={"code": "SB002", "uri": uri})
    sid, path = unquote(m.group("sid")), unquote(m.group("path"))
    limit = core.max_resource_bytes
    try:
        data = core.read_bytes(caller, sid, path, length=limit)
        size: int | None = getattr(data, "total_size", None)  # the file's size, where the provider tells it
        if len(data) < limit:  # the end of the file came first
            size = len(data) if size is None else size
        elif size is None or size <= limit:  # exactly the limit, or a provider that cannot tell: one byte more?
            size = None if core.read_bytes(caller, sid, path, offset=limit, length=1) else len(data)
    except SandboxError as e:
        raise MCPError(code=types.INVALID_PARAMS, message=f"{e.code}: {e.message}") from None
    if size is None or size > limit:
        message, details = too_large(uri, sid, path, size, limit, data)
        raise MCPError(code=types.INVALID_PARAMS, message=message, data=details)
    mime = _mime(path)
    if looks_text(data):  # read_file's test (no NUL in the first 8 KiB), and UTF-8: the name does not decide
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return types.ReadResourceResult(contents=[types.TextResourceContents(
                uri=uri, mime_type="text/plain" if mime == "application/octet-stream" else mime, text=text)])
    return types.ReadResourceResult(contents=[types.BlobResourceContents(
        uri=uri, mime_type=mime, blob=base64.b64encode(data).decode())])


def _list_files(core: ServiceCore, caller: Caller) -> list[types.Resource]:
    """At most MAX_LISTED_FILES readable files of the caller's running sessions, within one
    ``Steps`` budget for all (resource_list.py). A mimeType comes from the name only (a file whose
    name has none says ``application/octet-stream``); a read decides by the content."""
    out: list[types.Resource] = []
    steps = Steps()
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
        for f in iter_readable(files, steps):
            out.append(types.Resource(name=f"{sid}/{f.path}", uri=file_uri(sid, f.path), size=f.size,
                                      mime_type=_mime(f.path)))
            if len(out) >= MAX_LISTED_FILES:
                return out
    return out
