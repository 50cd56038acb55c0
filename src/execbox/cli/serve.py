"""``execbox serve``: the HTTP service (uvicorn) with the /v1/sandbox API, admin API and console.

On first start with no tokens it creates an admin token and prints it once: after every startup
check passed (a start that fails creates none), and once per store however many processes start
at once (service/store/first_token.py). It refuses to serve a provider without isolation
(``local``) on a non-loopback address unless told to, and warns about every ``EXECBOX_*`` /
``SANDBOX_*`` environment variable it does not read (env_names.py: a misspelled name is not
silently ignored).
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Any

import typer

from ..errors import InvalidConfigError, SandboxError
from ._options import LOG_LEVEL, LogLevel


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
    log_level: LogLevel = LOG_LEVEL,
) -> None:
    """Start the sandbox service (uvicorn). Tokens: `execbox token create --tenant T [--admin]`."""
    import uvicorn

    from ..boxes.runtime_build import check_index_settings
    from ..env_names import unknown_name_warnings
    from ..service.app import create_app
    from ..service.config import ServiceSettings
    from ..service.container import state_services
    from ..service.fd_limit import raise_open_file_limit
    from ..service.logs import configure_json_logging
    from ..service.routes.executor_compat import ExecutorAuth, is_loopback
    from ..service.store import open_store
    from ..service.store.first_token import create_first_admin_token
    from ._store_cli import fail

    if open_run and not is_loopback(host):
        fail(InvalidConfigError(f"--open-run serves /run without a token and is only allowed on a loopback bind, "
                                f"not {host}", details={"field": "--open-run", "host": host}))

    for line in unknown_name_warnings(os.environ):  # a misspelled EXECBOX_DATABASE_URL must not pass unnoticed
        typer.echo(line, err=True)
    raise_open_file_limit()  # before the first box starts (service/fd_limit.py)
    try:
        check_index_settings()  # EXECBOX_PIP_INDEX_URL / EXECBOX_NPM_REGISTRY: SB002 here, never a tenant's
        settings = ServiceSettings.from_env()
        check_port_free(host, port)
        store = open_store()
        # Not only at start: the manager refuses it whenever the provider is switched or rebuilt.
        refused = None if is_loopback(host) or allow_no_isolation else f"the service listens on {host}"
        app = create_app(store=store, settings=settings,
                         executor_auth=ExecutorAuth.for_bind(host) if open_run else None,
                         no_isolation_refused=refused)
        provider = state_services(app).providers.current()
        state_services(app).sessions.refuse_duplicate_id()  # a duplicated EXECBOX_REPLICA_ID: SB002
        first = create_first_admin_token(store)  # last: a start that failed has created no token
    except SandboxError as e:
        fail(e)
    if first is not None:
        rec, plaintext = first
        typer.echo("No API tokens existed: created an admin token (shown once, store it now):", err=True)
        typer.echo(f"  {plaintext}", err=True)
        typer.echo(f"  id {rec.id}, tenant 'default'; more with `execbox token create --tenant T`", err=True)
    configure_json_logging()
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    typer.echo(f"execbox {app.version}: provider {provider.name} (isolation {provider.isolation.value}), "
               f"data in {store.data_dir}, database {store.url}", err=True)
    # SIGTERM/SIGINT: uvicorn stops accepting and the sessions start draining at once (new work
    # refused, what still runs after drain_timeout cancelled, so each request gets its answer);
    # uvicorn's own deadline comes CANCEL_GRACE later. Then the lifespan stops the boxes
    # (sessions kept: docs/sessions.md).
    sessions = state_services(app).sessions

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)  # exits the process when the lifespan or the bind failed
            bound = next((sock.getsockname()[1] for srv in getattr(self, "servers", []) for sock in srv.sockets),
                         port)  # the real port when --port 0
            for line in url_lines(shown, bound, settings.api_docs):
                typer.echo(line, err=True)

        def handle_exit(self, sig: int, frame: Any) -> None:
            sessions.begin_drain()
            super().handle_exit(sig, frame)

    Server(uvicorn.Config(app, host=host, port=port, log_level=LogLevel(log_level).value, access_log=False,
                          timeout_graceful_shutdown=int(settings.drain_timeout) + CANCEL_GRACE)).run()


def url_lines(host: str, port: int, api_docs: bool) -> list[str]:
    """Where the API and console answer, once bound (``port`` the bound one). /docs and /redoc
    only when EXECBOX_API_DOCS serves them (service/api_docs.py); /openapi.json always."""
    openapi = "/docs, /redoc, /openapi.json" if api_docs else "/openapi.json"
    return [f"  API      http://{host}:{port}/v1/sandbox  (OpenAPI: {openapi})",
            f"  console  http://{host}:{port}/admin/    health: /healthz /readyz /metrics"]


CANCEL_GRACE = 10
"""Seconds between cancelling runs still going at drain_timeout and uvicorn cutting requests off."""


def check_port_free(host: str, port: int) -> None:
    """SB002 when ``host:port`` cannot be bound (in use, an address not on this host), checked
    before anything is created; uvicorn binds it for real moments later. Port 0 always binds."""
    if port == 0:
        return
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as e:
        raise InvalidConfigError(f"--host {host}: cannot resolve it: {e}", details={"field": "--host"}) from None
    for family, kind, proto, _name, address in addresses:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                sock.bind(address)
            except OSError as e:
                why = "it is in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
                raise InvalidConfigError(f"cannot listen on {host}:{port}: {why}",
                                         details={"field": "--port", "host": host, "port": port}) from None


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
