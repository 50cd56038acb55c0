"""``execbox serve``: the HTTP service (uvicorn) with the /v1/sandbox API, admin API and console.

On first start with no tokens it creates an admin token and prints it once. It refuses to serve
a provider without isolation (``local``) on a non-loopback address unless told to.
"""

from __future__ import annotations

from typing import Any

import typer

from ..errors import InvalidConfigError, SandboxError


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="Port to bind (0: any free port)."),
    allow_no_isolation: bool = typer.Option(
        False, "--allow-no-isolation",
        help="Serve the 'local' provider (no isolation) on a non-loopback address anyway."),
    open_run: bool = typer.Option(
        False, "--open-run",
        help="Answer the RAGFlow executor API (/run) without a token, as RAGFlow's own executor does. "
             "Only on a loopback bind."),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn log level."),
) -> None:
    """Start the sandbox service (uvicorn). Tokens: `execbox token create --tenant T [--admin]`."""
    import uvicorn

    from ..boxes.runtime_build import check_index_settings
    from ..service.app import create_app
    from ..service.config import ServiceSettings
    from ..service.container import state_services
    from ..service.fd_limit import raise_open_file_limit
    from ..service.logs import configure_json_logging
    from ..service.routes.executor_compat import ExecutorAuth, is_loopback
    from ..service.store import open_store
    from ._store_cli import fail

    if open_run and not is_loopback(host):
        fail(InvalidConfigError(f"--open-run serves /run without a token and is only allowed on a loopback bind, "
                                f"not {host}", details={"field": "--open-run", "host": host}))

    raise_open_file_limit()  # before the first box starts (service/fd_limit.py)
    try:
        check_index_settings()  # EXECBOX_PIP_INDEX_URL / EXECBOX_NPM_REGISTRY: SB002 here, never a tenant's
        settings = ServiceSettings.from_env()
        store = open_store()
        if store.tokens.count() == 0:
            rec, plaintext = store.tokens.create("default", "admin", "first-start admin")
            typer.echo("No API tokens existed: created an admin token (shown once, store it now):", err=True)
            typer.echo(f"  {plaintext}", err=True)
            typer.echo(f"  id {rec.id}, tenant 'default'; more with `execbox token create --tenant T`", err=True)
        # Not only at start: the manager refuses it whenever the provider is switched or rebuilt.
        refused = None if is_loopback(host) or allow_no_isolation else f"the service listens on {host}"
        app = create_app(store=store, settings=settings,
                         executor_auth=ExecutorAuth.for_bind(host) if open_run else None,
                         no_isolation_refused=refused)
        provider = state_services(app).providers.current()
        state_services(app).sessions.refuse_duplicate_id()  # a duplicated EXECBOX_REPLICA_ID: SB002
    except SandboxError as e:
        fail(e)
    configure_json_logging()
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    typer.echo(f"execbox {app.version}: provider {provider.name} (isolation {provider.isolation.value}), "
               f"data in {store.data_dir}", err=True)
    typer.echo(f"  API      http://{shown}:{port}/v1/sandbox  (OpenAPI: /docs, /openapi.json)", err=True)
    typer.echo(f"  console  http://{shown}:{port}/admin/    health: /healthz /readyz /metrics", err=True)
    # SIGTERM/SIGINT: uvicorn stops accepting and the sessions start draining at once (new work
    # refused, what still runs after drain_timeout cancelled, so each request gets its answer);
    # uvicorn's own deadline comes CANCEL_GRACE later. Then the lifespan stops the boxes
    # (sessions kept: docs/sessions.md).
    sessions = state_services(app).sessions

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            sessions.begin_drain()
            super().handle_exit(sig, frame)

    Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                          timeout_graceful_shutdown=int(settings.drain_timeout) + CANCEL_GRACE)).run()


CANCEL_GRACE = 10
"""Seconds between cancelling runs still going at drain_timeout and uvicorn cutting requests off."""


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
