"""Wires egress into the service: audit rows in SQL, tenant caps, Prometheus counters, routes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import sessionmaker

from ..egress import audit
from . import egress_hook
from .store.egress_store import EgressAuditRepo, EgressAuditWriter, TenantCaps


@dataclass
class EgressService:
    repo: EgressAuditRepo
    writer: EgressAuditWriter
    caps: TenantCaps

    def close(self) -> None:
        audit.remove_sink(self.writer)
        self.writer.close()


def install(app: Any, store: Any, metrics: Any) -> EgressService:
    repo = EgressAuditRepo(sessionmaker(store.engine, expire_on_commit=False))
    svc = EgressService(repo, EgressAuditWriter(repo), TenantCaps(store.settings))
    audit.add_sink(svc.writer)
    egress_hook.caps_lookup = svc.caps.get
    metrics.registry.register(audit.EgressCollector())
    app.state.egress = svc
    from .routes import egress

    app.include_router(egress.router)
    return svc
