"""Wires egress into the service: audit rows in SQL, tenant caps, Prometheus counters, routes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import sessionmaker

from ..egress import audit, inject
from ..egress.gateway import Limits
from . import egress_hook
from .store.egress_store import EgressAuditRepo, EgressAuditWriter, TenantCaps

if TYPE_CHECKING:  # pragma: no cover
    from .container import Services


@dataclass
class EgressService:
    repo: EgressAuditRepo
    writer: EgressAuditWriter
    caps: TenantCaps

    def close(self) -> None:
        audit.remove_sink(self.writer)
        self.writer.close()


class _DroppedCollector:
    """execbox_egress_audit_dropped_total: records the store never got (queue full, write failed)."""

    def __init__(self, writer: EgressAuditWriter) -> None:
        self.writer = writer

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        c = CounterMetricFamily("execbox_egress_audit_dropped", "Egress audit records not written to the store")
        c.add_metric([], self.writer.dropped)
        yield c


def install(app: Any, services: Services) -> EgressService:
    """Build the egress service into ``services.egress`` and mount its routes."""
    Limits.from_env()  # a bad per-box cap stops `execbox serve` (SB002) instead of every box start
    inject.idle_timeout()  # so does a bad EXECBOX_EGRESS_INTERCEPT_IDLE
    store = services.store
    repo = EgressAuditRepo(sessionmaker(store.engine, expire_on_commit=False))
    svc = EgressService(repo, EgressAuditWriter(repo), TenantCaps(store.settings))
    audit.add_sink(svc.writer)
    egress_hook.caps_lookup = svc.caps.get
    services.metrics.registry.register(audit.EgressCollector())
    services.metrics.registry.register(_DroppedCollector(svc.writer))
    services.egress = svc
    from .routes import egress

    app.include_router(egress.router)
    return svc
