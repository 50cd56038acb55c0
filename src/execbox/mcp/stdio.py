"""`execbox mcp`: the MCP server over stdio for one local user.

The service core (session manager and run path) is built in-process on one provider, so tool
calls behave exactly as through `execbox serve`; the process's one MCP connection maps to one
execbox session, closed when the client disconnects.
"""

from __future__ import annotations

import tempfile
from typing import Any

import anyio
from mcp.server.stdio import stdio_server

from ..providers.base import SandboxProvider
from ..sdk.local import get_sandbox
from ..service.background import ProcessTable
from ..service.config import ServiceSettings
from ..service.executions import RunService
from ..service.fd_limit import raise_open_file_limit
from ..service.logs import OperationLog
from ..service.metrics import ServiceMetrics
from ..service.sessions import SessionManager, check_name
from .core import Caller, ServiceCore
from .output_cap import DEFAULT_MAX_OUTPUT
from .resource_cap import max_resource_bytes_from_env
from .server import build_server

STDIO_KEY = "stdio"


class _OneProvider:
    """The session manager's provider source, fixed to the provider chosen on the command line."""

    def __init__(self, provider: SandboxProvider) -> None:
        self.provider = provider

    def current(self) -> SandboxProvider:
        return self.provider

    def candidates(self) -> list[SandboxProvider]:
        return [self.provider]


def serve_stdio(provider: str | None, tenant: str, max_timeout: float, workspaces: str | None = None,
                config: dict[str, Any] | None = None, max_output: int = DEFAULT_MAX_OUTPUT,
                max_resource_bytes: int | None = None) -> None:
    """``max_resource_bytes``: None reads EXECBOX_MCP_MAX_RESOURCE_BYTES (a bad value: SB002 before
    anything starts)."""
    check_name(tenant, "tenant")
    if max_resource_bytes is None:
        max_resource_bytes = max_resource_bytes_from_env()
    raise_open_file_limit()  # before the first box starts (service/fd_limit.py)
    prov = get_sandbox(provider, config)
    settings = ServiceSettings.from_env()
    root = workspaces or tempfile.mkdtemp(prefix="execbox-mcp-")
    sessions = SessionManager(_OneProvider(prov), settings, root, None)
    runs = RunService(sessions, ServiceMetrics(), OperationLog(None, settings.audit_code))
    core = ServiceCore(sessions, runs, settings.default_timeout, max_timeout, settings.max_code_bytes, max_output,
                       ProcessTable(runs, settings.max_background_processes), max_resource_bytes)
    caller = Caller(tenant)
    server = build_server(lambda ctx: (core, caller, STDIO_KEY))
    sessions.start()

    async def run() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    try:
        anyio.run(run)
    finally:
        core.close_all_implicit()
        sessions.shutdown()
        prov.shutdown()
