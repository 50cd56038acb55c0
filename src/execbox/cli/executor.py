"""``execbox executor``: serve only the RAGFlow-compatible ``/run`` + ``/healthz`` API.

For operators who want a drop-in for RAGFlow's executor_manager (port 9385) without the full
service. Without a token it binds to loopback only; a public bind needs ``--token`` or an
explicit ``--allow-unauthenticated``. Without a token /run also only answers JSON requests with
no foreign ``Origin`` and an allowed ``Host`` (loopback names, the bind address,
``--allowed-host``): web pages cannot reach it (executor_access.open_mode_refusal).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ..errors import SandboxError
from ._options import LOG_LEVEL, LogLevel


def _fail(message: str) -> None:
    typer.secho(message, err=True, fg=typer.colors.RED)
    raise typer.Exit(2)


def executor(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to bind (RAGFlow's executor uses 9385).")] = 9385,
    provider: Annotated[str | None, typer.Option(
        help="Provider to run code on (default: the settings store's active provider when a store exists, "
             "else SANDBOX_TYPE, else the jail).")] = None,
    config: Annotated[str | None, typer.Option(
        help="Provider config as a JSON object, over the settings the store holds for the provider.")] = None,
    token: Annotated[str | None, typer.Option(
        envvar="EXECBOX_EXECUTOR_TOKEN",
        help="Bearer token clients must send. Prefer the EXECBOX_EXECUTOR_TOKEN environment variable: a "
             "--token value is visible to other users in the process list (ps).",
        show_default=False)] = None,
    allow_unauthenticated: Annotated[bool, typer.Option(
        help="Serve /run without a token on a non-loopback address.")] = False,
    allowed_host: Annotated[list[str] | None, typer.Option(
        envvar="EXECBOX_EXECUTOR_ALLOWED_HOSTS",
        help="Without a token: another Host name /run answers to besides localhost, 127.0.0.1, ::1 and the "
             "bind address (repeatable; env EXECBOX_EXECUTOR_ALLOWED_HOSTS, comma-separated).",
        show_default=False)] = None,
    allow_no_isolation: Annotated[bool, typer.Option(
        help="Allow the 'local' provider (no isolation) on a non-loopback address.")] = False,
    log_level: LogLevel = LOG_LEVEL,
) -> None:
    """Serve RAGFlow's executor API (POST /run, GET /healthz) on the active provider.

    The active provider and its settings come from the settings store (EXECBOX_DATABASE_URL, or
    execbox.db in EXECBOX_DATA_DIR) when one exists, as `execbox config` set them; none is created."""
    import uvicorn

    from ..models import Isolation
    from ..sdk.local import get_sandbox
    from ..service.fd_limit import raise_open_file_limit
    from ..service.routes.executor_compat import ExecutorAuth, create_executor_app, is_loopback
    from ._stored import stored_provider

    public = not is_loopback(host)
    if public and not token and not allow_unauthenticated:
        _fail(f"refusing to serve /run on {host} without authentication: pass --token (or "
              "EXECBOX_EXECUTOR_TOKEN), or --allow-unauthenticated if a proxy in front authenticates")
    try:
        cfg = json.loads(config) if config else None
        if cfg is not None and not isinstance(cfg, dict):
            _fail("--config must be a JSON object")
        provider, cfg, from_store = stored_provider(provider, cfg)
        raise_open_file_limit()  # before the first box starts (service/fd_limit.py)
        prov = get_sandbox(provider, cfg)
    except json.JSONDecodeError as e:
        _fail(f"--config is not valid JSON: {e}")
        return
    except SandboxError as e:
        _fail(str(e))
        return
    if public and prov.isolation == Isolation.NONE and not allow_no_isolation:
        prov.shutdown()
        _fail(f"refusing to serve provider {prov.name!r} (no isolation) on {host}: use jail or docker, "
              "or pass --allow-no-isolation")
    extra_hosts = [h.strip() for value in allowed_host or [] for h in value.split(",") if h.strip()]
    auth = ExecutorAuth.for_bind(host, allow_unauthenticated=allow_unauthenticated, token=token,
                                 allowed_hosts=extra_hosts)
    mode = "open (loopback)" if auth.open and not public else ("open (--allow-unauthenticated)" if auth.open
                                                              else "bearer token")
    source = " (settings store)" if from_store else ""
    typer.echo(f"execbox executor: provider={prov.name}{source} isolation={prov.isolation.value} auth={mode} "
               f"listening on http://{host}:{port}", err=True)
    if auth.open:
        names = ", ".join(sorted(auth.hosts)) + (", any IP address" if auth.any_ip else "")
        typer.echo(f"open /run answers JSON requests without a foreign Origin, for Host: {names}", err=True)
    if prov.selection_note:
        typer.echo(f"note: {prov.selection_note}", err=True)
    uvicorn.run(create_executor_app(prov, auth=auth), host=host, port=port, log_level=LogLevel(log_level).value)


def register(app: typer.Typer) -> None:
    app.command("executor")(executor)
