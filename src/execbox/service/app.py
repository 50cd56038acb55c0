"""create_app(): the one FastAPI application behind `execbox serve`, composed explicitly.

The factory builds every collaborator (store, provider manager, session manager, metrics, audit,
run service, egress, executor API dependencies) into one ``Services`` container
(service/container.py) that routes read through the ``services`` dependency, then mounts the
routers it imports directly. Tests pass their own ``store``, ``providers`` (anything with
current() and candidates()) and ``settings``; production gets the store from EXECBOX_DATA_DIR /
EXECBOX_DATABASE_URL and the active provider from ProviderManager (hot-reloaded from the store).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute

from .. import __version__
from ..web import mount as mount_console
from ..web import tokens_api
from . import api_docs
from .config import ServiceSettings
from .container import Services
from .disconnect import CancelOnDisconnect
from .e2b_compat import install as install_e2b
from .egress_service import install as install_egress
from .errors import ADMIN_BODY_LIMITS, BodyLimit, install_error_handlers
from .executions import RunService
from .forward_watch import OwnerWatch
from .forwarding import ForwardToOwner
from .logs import AuditWriter, OperationLog
from .metrics import ServiceMetrics
from .provider_manager import ProviderManager
from .routes import admin, executor_compat, file_changes, health, packages, sandbox
from .routes import processes as process_routes
from .routes import sessions as session_routes
from .routes.executor_compat import ExecutorAuth, ExecutorDeps
from .session_headers import SessionHeaders
from .sessions import ProviderSource, SessionManager
from .store.sandbox_settings import SandboxSettings
from .token_gate import TokenGate

log = logging.getLogger("execbox.service")

WORKER_THREADS = 128
"""Sync routes run on anyio's thread pool; its default of 40 would cap concurrent executions."""

WEB_STATIC = Path(__file__).resolve().parent.parent / "web" / "static"


def _mcp_app(svc: Services) -> Any | None:
    try:
        from ..mcp.http import McpHttpApp
    except ImportError as e:  # the optional `mcp` extra (the MCP SDK) is not installed
        log.warning("MCP endpoint disabled: %s", e)
        return None
    return McpHttpApp(svc)


def _record_interrupted(store: Any, replica: str) -> None:
    """Runs this replica's last life started and never finished (it was killed mid-run) get their
    audit rows now, as ``interrupted`` (store/audit_inflight.py)."""
    from .store import audit_inflight

    try:
        n = audit_inflight.recover(store.engine, replica)
    except Exception:  # noqa: BLE001 - the service starts anyway; the entries wait for the next start
        log.exception("recording the runs interrupted by the last stop failed")
        return
    if n:
        log.warning("%d runs were cut off by the service's last stop; audited as 'interrupted'", n)


def _sandbox_settings(store: Any, providers: ProviderSource) -> SandboxSettings:
    """The ProviderManager's settings (one key ring) when it is the provider source, else the store's."""
    if isinstance(providers, ProviderManager):
        return providers.settings
    return SandboxSettings(store)


def _pool_statuses(providers: ProviderSource) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        candidates = providers.candidates()
    except Exception:  # noqa: BLE001 - a scrape must not fail because no provider is configured
        return
    for p in candidates:
        status_fn = getattr(p, "pool_status", None)
        status = status_fn() if status_fn is not None else None
        if status:
            yield p.name, status


def _without(router: APIRouter, paths: set[str]) -> APIRouter:
    out = APIRouter()
    out.routes.extend(r for r in router.routes if getattr(r, "path", None) not in paths)
    return out


def _sandbox_ids(prefix: str):  # noqa: ANN202
    def unique_id(route: APIRoute) -> str:
        return f"{prefix}{route.name}"

    return unique_id


def create_app(store: Any | None = None, providers: ProviderSource | None = None,
               settings: ServiceSettings | None = None, executor_auth: ExecutorAuth | None = None,
               no_isolation_refused: str | None = None) -> FastAPI:
    """``executor_auth``: how RAGFlow's /run authenticates (default: the service's tokens).
    ``no_isolation_refused``: why providers without isolation may not serve (ProviderManager)."""
    settings = settings or ServiceSettings.from_env()
    if store is None:
        from .store import open_store

        store = open_store()
    owns_providers = providers is None
    if providers is None:
        providers = ProviderManager(store, no_isolation_refused=no_isolation_refused)
    workspaces = settings.resolve_workspaces_dir(settings.data_dir or str(store.data_dir))

    metrics = ServiceMetrics()
    sessions = SessionManager(providers, settings, workspaces, metrics, registry=store.sessions)
    metrics.bind_live(sessions.count, lambda: _pool_statuses(providers))
    audit = AuditWriter(store)
    _record_interrupted(store, sessions.replica)
    runs = RunService(sessions, metrics, OperationLog(audit, settings.audit_code, sessions.replica))
    svc = Services(settings=settings, store=store, providers=providers,
                   sandbox_settings=_sandbox_settings(store, providers), metrics=metrics, sessions=sessions,
                   audit=audit, runs=runs,
                   executor=ExecutorDeps(providers, executor_auth or ExecutorAuth(), runs, store,
                                         settings.max_code_bytes))
    mcp_app = _mcp_app(svc)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        limiter = anyio.to_thread.current_default_thread_limiter()
        limiter.total_tokens = max(limiter.total_tokens, WORKER_THREADS)
        sessions.start()
        try:
            async with AsyncExitStack() as stack:
                if mcp_app is not None:
                    await stack.enter_async_context(mcp_app.lifespan())
                yield
        finally:
            await anyio.to_thread.run_sync(sessions.shutdown)
            audit.close()
            if svc.egress is not None:
                svc.egress.close()
            if owns_providers and hasattr(providers, "shutdown"):
                await anyio.to_thread.run_sync(providers.shutdown)

    app = FastAPI(title="execbox", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Multi-tenant code sandbox: run untrusted Python, JavaScript and bash in "
                              "isolated per-session workspaces. Errors: {\"error\": {code, message, details}}.")
    app.state.services = svc  # routes read it via container.services
    app.state.executor = svc.executor  # what the RAGFlow /run routes read (also in the standalone app)
    install_error_handlers(app)
    if settings.api_docs:  # /docs and /redoc load a CDN's scripts: off unless asked for (api_docs.py)
        api_docs.install(app)
    install_egress(app, svc)  # issue 14: egress audit, tenant caps, routes
    app.add_middleware(SessionHeaders)  # innermost: X-Execbox-Session-Created / -Create-Session (any status)
    app.add_middleware(ForwardToOwner, replica=sessions.replica,  # inside BodyLimit: bodies are bounded
                       watch=OwnerWatch(sessions.registry.get, settings.lease_ttl) if sessions.fences() else None)
    app.add_middleware(CancelOnDisconnect)  # a plain execute/bash run whose client left is cancelled
    app.add_middleware(TokenGate, services=svc)  # outside ForwardToOwner: no token, no body read

    app.include_router(health.router)  # first: its /healthz wins over the executor's
    # the gateway API, public and direct paths
    for router in (sandbox.router, session_routes.router, file_changes.router):
        app.include_router(router, prefix="/v1/sandbox", tags=["sandbox"],
                           generate_unique_id_function=_sandbox_ids("v1_"))
        app.include_router(router, tags=["sandbox (direct)"], generate_unique_id_function=_sandbox_ids(""))
    app.include_router(admin.router)
    # /run; its own /healthz is for the standalone executor app (ours answers here)
    app.include_router(_without(executor_compat.router, {"/healthz"}))
    app.include_router(packages.router)  # runtimes + in-session install
    process_routes.install(app, svc)  # background processes in a session (under /v1/sandbox and bare)
    app.include_router(tokens_api.router)  # the console's Tokens page
    if mcp_app is not None:  # streamable HTTP MCP endpoint (execbox.mcp), bearer-token authenticated
        app.add_route("/mcp", mcp_app, methods=["GET", "POST", "DELETE"], include_in_schema=False)
    install_e2b(app, svc)  # E2B-compatible control plane + sandbox URL (docs/e2b-compat.md)
    # outermost (added last): every request, the E2B sandbox URL's included, is bounded before parsing
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes, metrics=metrics,
                       shapes=executor_compat.BODY_SHAPES,  # /run answers 413 in its own shape
                       limits=ADMIN_BODY_LIMITS)  # admin bodies are small
    if WEB_STATIC.is_dir():
        mount_console(app, "/admin", WEB_STATIC)  # with the console's security headers (web/__init__.py)
    return app
