"""Egress HTTP API (issue 14): audit (admin), tenant caps (admin), a live session's network policy.

- GET  /api/admin/egress/audit?tenant_id=&session_id=&decision=&limit=   newest first
- GET  /api/admin/egress/caps            PUT/DELETE /api/admin/egress/caps/{tenant_id}
- GET  /v1/sandbox/sessions/{tenant_id}/{session_id}/network   the effective policy
- PUT  /v1/sandbox/sessions/{tenant_id}/{session_id}/network   narrow it (403 if wider; SB002 bad entry)
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from ...egress import audit as egress_audit
from ...errors import InvalidConfigError, SessionNotFoundError
from .. import egress_hook
from ..auth import Principal, require_admin, require_token
from ..container import services
from ..schemas import ERROR_RESPONSES
from .sandbox import NAME_PATTERN, tenant_for

router = APIRouter(tags=["egress"], responses=ERROR_RESPONSES)


def _name() -> Any:
    return Path(pattern=NAME_PATTERN, max_length=64)


FILTER_PATTERN = f"^$|{NAME_PATTERN}"
"""A tenant/session filter: a name as the session routes take it, or empty (no filter). Anything
else is 400 naming the parameter (a NUL made PostgreSQL's driver fail: 500; review 47 F1)."""
DECISIONS = ("allowed", "denied", "limited")


class NetworkIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    network: str = Field(description="none | allowlist | open")
    allow: list[Any] = Field(default_factory=list, description="HOST[:PORTS] entries (allowlist only)")


def _service(request: Request) -> Any:
    svc = services(request).egress
    if svc is None:
        raise InvalidConfigError("egress audit store is not configured", details={})
    return svc


@router.get("/api/admin/egress/audit", summary="Egress connection attempts, newest first (admin)")
def audit(request: Request, limit: int = 100,
          tenant_id: str | None = Query(None, pattern=FILTER_PATTERN, max_length=64),
          session_id: str | None = Query(None, pattern=FILTER_PATTERN, max_length=64),
          decision: str | None = None, _: Principal = Depends(require_admin)) -> dict[str, Any]:
    if not 1 <= limit <= 1000:
        raise InvalidConfigError("limit must be between 1 and 1000", details={"fields": {"limit": "1..1000"}})
    if decision is not None and decision not in DECISIONS:
        raise InvalidConfigError(f"decision must be one of {', '.join(DECISIONS)}",
                                 details={"fields": {"decision": decision[:20]}})
    svc = _service(request)
    svc.writer.flush(2.0)
    rows = svc.repo.list(limit=limit, tenant_id=tenant_id, session_id=session_id, decision=decision)
    counts = {f"{k}/{d}": n for (k, d), n in egress_audit.counts().items()}
    return {"data": rows, "counts": counts}


@router.get("/api/admin/egress/caps", summary="Per-tenant network caps (admin)")
def caps(request: Request, _: Principal = Depends(require_admin)) -> dict[str, Any]:
    return {"caps": _service(request).caps.all()}


@router.put("/api/admin/egress/caps/{tenant_id}", summary="Set a tenant's network cap (admin)")
def set_cap(body: NetworkIn, request: Request, tenant_id: str = _name(),
            _: Principal = Depends(require_admin)) -> Any:
    return {"tenant_id": tenant_id, "cap": _service(request).caps.set(tenant_id, body.network, body.allow)}


@router.delete("/api/admin/egress/caps/{tenant_id}", summary="Remove a tenant's network cap (admin)")
def delete_cap(request: Request, tenant_id: str = _name(), _: Principal = Depends(require_admin)) -> Any:
    return {"tenant_id": tenant_id, "deleted": _service(request).caps.delete(tenant_id)}


def _live(request: Request, principal: Principal, tenant_id: str, session_id: str) -> Any:
    tenant = tenant_for(principal, tenant_id)
    s = services(request).sessions.get(tenant, session_id)
    if s is None or s.provider is None or s.instance_id is None:
        raise SessionNotFoundError(f"no live session {tenant}/{session_id}",
                                   details={"tenant_id": tenant, "session_id": session_id})
    return s


@router.get("/v1/sandbox/sessions/{tenant_id}/{session_id}/network", summary="A session's effective network policy")
def get_network(request: Request, tenant_id: str = _name(), session_id: str = _name(),
                principal: Principal = Depends(require_token)) -> Any:
    s = _live(request, principal, tenant_id, session_id)
    return {"tenant_id": s.tenant_id, "session_id": s.session_id, **egress_hook.describe(s)}


@router.put("/v1/sandbox/sessions/{tenant_id}/{session_id}/network",
            summary="Narrow a live session's network policy (takes effect without a restart)")
def put_network(body: NetworkIn, request: Request, tenant_id: str = _name(), session_id: str = _name(),
                principal: Principal = Depends(require_token)) -> Any:
    s = _live(request, principal, tenant_id, session_id)
    # no session lock: a running execution sees the narrower policy on its next connection
    effective = egress_hook.narrow_session(s.provider, s, body.network, body.allow)
    return {"tenant_id": s.tenant_id, "session_id": s.session_id, "network": effective}
