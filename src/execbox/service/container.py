"""The service's object graph, built once by ``create_app`` and read by every route.

Routes, middleware-facing helpers, MCP and the E2B-compatible API get their collaborators from
this typed container (``services(request)``, or the ``Depends(services)`` FastAPI dependency)
instead of ad-hoc attributes on ``app.state``: what the service is made of is visible in one
dataclass, and a missing piece is a type error rather than a ``getattr`` default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request

from .config import ServiceSettings
from .executions import RunService
from .logs import AuditWriter
from .metrics import ServiceMetrics
from .sessions import ProviderSource, SessionManager
from .store.sandbox_settings import SandboxSettings

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only (they import this module's users)
    from .background import ProcessTable
    from .e2b_compat.registry import Registry
    from .egress_service import EgressService
    from .routes.executor_compat import ExecutorDeps


@dataclass
class Services:
    """Everything one ``execbox serve`` app is composed of."""

    settings: ServiceSettings
    store: Any
    """The settings store (execbox.service.store.Store): tokens, audit, sessions registry, settings."""
    providers: ProviderSource
    """The ProviderManager in production; any ``current()``/``candidates()`` holder in tests."""
    sandbox_settings: SandboxSettings
    metrics: ServiceMetrics
    sessions: SessionManager
    audit: AuditWriter
    runs: RunService
    executor: ExecutorDeps
    egress: EgressService | None = None
    e2b: Registry | None = None
    processes: ProcessTable | None = None
    """Background processes of the HTTP API (routes/processes.py sets it)."""


def services(request: Request) -> Services:
    """FastAPI dependency (and plain accessor): the app's Services."""
    return request.app.state.services


def state_services(app: Any) -> Services:
    """The Services of an app object (CLI and tests, outside a request)."""
    return app.state.services
