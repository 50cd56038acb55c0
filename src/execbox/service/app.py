"""create_app(): the one FastAPI application behind `execbox serve`.

Tests pass their own ``store``, ``providers`` (anything with current() and candidates()) and
``settings``; production gets the store from EXECBOX_DATA_DIR / EXECBOX_DATABASE_URL and the
active provider from ProviderManager (hot-reloaded from the settings store).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles

from .. import __version__
from .config import ServiceSettings
from .egress_service import install as install_egress
from .errors import BodyLimit, install_error_handlers
from .executions import RunService
from .logs import AuditWriter, OperationLog
from .metrics import ServiceMetrics
from .sessions import ProviderSource, SessionManager

log = logging.getLogger("execbox.service")

WORKER_THREADS = 128
"""Sync routes run on anyio's thread pool; its default of 40 would cap concurrent executions."""

WEB_STATIC = Path(__file__).resolve().parent.parent / "web" / "static"


def _optional_router(module: str) -> Any | None:
    """A router built by another part of the service, or None while that module does not exist yet."""
    try:
        return importlib.import_module(module).router
    except ModuleNotFoundError as e:
        if e.name == module:
            log.warning("%s is not installed; its routes are not served", module)
            return None
        raise


def _default_providers(store: Any) -> ProviderSource:
    from .provider_manager import ProviderManager

    return ProviderManager(store)


def _mcp_app(app: FastAPI) -> Any | None:
    try:
        from ..mcp.http import McpHttpApp
    except ImportError as e:  # the optional `mcp` SDK is not installed
        log.warning("MCP endpoint disabled: %s", e)
        return None
    return McpHttpApp(app.state)


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
               settings: ServiceSettings | None = None) -> FastAPI:
    settings = settings or ServiceSettings.from_env()
    if store is None:
        from .store import open_store

        store = open_store()
    owns_providers = providers is None
    if providers is None:
        providers = _default_providers(store)
    workspaces = settings.resolve_workspaces_dir(settings.data_dir or str(store.data_dir))

    metrics = ServiceMetrics()
    sessions = SessionManager(providers, settings, workspaces, metrics,
                              registry=getattr(store, "sessions", None))
    metrics.bind_live(sessions.count, lambda: _pool_statuses(providers))
    audit = AuditWriter(store)
    runs = RunService(sessions, metrics, OperationLog(audit, settings.audit_code))
    mcp_app: Any = None

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
            egress_svc.close()
            if owns_providers and hasattr(providers, "shutdown"):
                await anyio.to_thread.run_sync(providers.shutdown)

    app = FastAPI(title="execbox", version=__version__, lifespan=lifespan,
                  description="Multi-tenant code sandbox: run untrusted Python, JavaScript and bash in "
                              "isolated per-session workspaces. Errors: {\"error\": {code, message, details}}.")
    app.state.store = store
    app.state.providers = providers
    app.state.sessions = sessions
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.audit = audit
    app.state.runs = runs
    install_error_handlers(app)
    egress_svc = install_egress(app, store, metrics)  # issue 14: egress audit, tenant caps, routes
    from .forwarding import ForwardToOwner

    app.add_middleware(ForwardToOwner, replica=sessions.replica)  # inside BodyLimit: bodies are bounded
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)

    from .routes import health, sandbox

    app.include_router(health.router)  # first: its /healthz wins over the executor's
    app.include_router(sandbox.router, prefix="/v1/sandbox", tags=["sandbox"],
                       generate_unique_id_function=_sandbox_ids("v1_"))
    app.include_router(sandbox.router, tags=["sandbox (direct)"], generate_unique_id_function=_sandbox_ids(""))
    admin = _optional_router("execbox.service.routes.admin")
    if admin is not None:
        app.include_router(admin)
    compat = _optional_router("execbox.service.routes.executor_compat")
    if compat is not None:  # /run; its own /healthz is for the standalone executor app (ours answers here)
        app.include_router(_without(compat, {"/healthz"}))
    packages = _optional_router("execbox.service.routes.packages")  # runtimes + in-session install
    if packages is not None:
        app.include_router(packages)
    tokens = _optional_router("execbox.web.tokens_api")  # the console's Tokens page
    if tokens is not None:
        app.include_router(tokens)
    mcp_app = _mcp_app(app)
    if mcp_app is not None:  # streamable HTTP MCP endpoint (execbox.mcp), bearer-token authenticated
        app.add_route("/mcp", mcp_app, methods=["GET", "POST", "DELETE"], include_in_schema=False)
    from .e2b_compat import install as install_e2b

    install_e2b(app)  # E2B-compatible control plane + sandbox URL (docs/e2b-compat.md)
    if WEB_STATIC.is_dir():
        app.mount("/admin", StaticFiles(directory=WEB_STATIC, html=True), name="admin-console")
    return app
