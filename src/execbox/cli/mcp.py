"""``execbox mcp``: serve execbox's tools to an MCP client over stdio (one local user)."""

from __future__ import annotations

import json

import typer

from ..errors import SandboxError


def mcp(
    provider: str = typer.Option(None, "--provider", "-p",
                                 help="Provider (jail, docker, local, ...); default: SANDBOX_TYPE, else the "
                                      "jail (zero-config)."),
    tenant: str = typer.Option("local", "--tenant", help="Tenant the sessions belong to."),
    config: str = typer.Option(None, "--config", help="Provider config as JSON, e.g. '{\"runtime\": \"sci\"}'."),
    max_timeout: str = typer.Option("300s", "--max-timeout", help="Cap on any tool call's timeout."),
    max_output: str = typer.Option(None, "--max-output", envvar="EXECBOX_MCP_MAX_OUTPUT", show_default=False,
                                   help="Characters one tool reply gives the model: a run's stdout and stderr "
                                        "each (head and tail kept), a file page, a listing; a note says what was "
                                        "cut and how to read on (0: no cap). Default 32768."),
    workspaces: str = typer.Option(None, "--workspaces", help="Directory for session workspaces "
                                                              "(default: a new temporary directory)."),
) -> None:
    """Serve execbox as MCP tools on stdin/stdout (for Claude Desktop, IDEs and other MCP clients)."""
    from ..mcp.output_cap import DEFAULT_MAX_OUTPUT
    from ..mcp.stdio import serve_stdio
    from ..settings import parse_duration, parse_int
    from ._store_cli import fail

    try:
        cfg = json.loads(config) if config else None
        cap = parse_int(max_output, "--max-output", 0) if max_output and max_output.strip() else DEFAULT_MAX_OUTPUT
        serve_stdio(provider, tenant, parse_duration(max_timeout, "--max-timeout"), workspaces, cfg, cap)
    except json.JSONDecodeError as e:
        raise typer.BadParameter(f"--config is not JSON: {e}") from None
    except SandboxError as e:
        fail(e)


def register(app: typer.Typer) -> None:
    app.command("mcp")(mcp)
