"""Packages HTTP API (issue 14 part 5): runtime templates (admin, read-only) and in-session install.

- GET  /api/admin/runtimes                                      templates and their versions (console)
- GET  /api/admin/runtimes/{name}                               one template (``NAME`` or ``NAME@vN``)
- POST /v1/sandbox/sessions/{tenant_id}/{session_id}/install    pip/npm into the session's workspace

Templates are built with the CLI (`execbox runtime build`): a build runs for minutes and writes
to the jail directory, which is an operator's step, not a request. An install runs the tenant's
packages' code in the box (build steps, npm scripts), so it takes the run path (RunService.install,
as the MCP ``install_packages`` tool does): the tenant's execution slot (SB008 beyond
``tenant_max_executions``), the ``execbox_executions`` metric (language ``packages``) and one
audit row (operation ``install``, the requirements as code).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from ...boxes import runtime as rt
from ..auth import Principal, require_admin, require_token
from ..container import services
from ..schemas import ERROR_RESPONSES
from .sandbox import NAME_PATTERN, tenant_for

router = APIRouter(tags=["packages"], responses=ERROR_RESPONSES)


def _name() -> Any:
    return Path(pattern=NAME_PATTERN, max_length=64)


class InstallIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pip: list[str] = Field(default_factory=list, max_length=50, description="pip requirements, e.g. httpx>=0.27")
    npm: list[str] = Field(default_factory=list, max_length=50, description="npm packages, e.g. axios@1")
    timeout: float | None = Field(default=None, gt=0, le=3600, description="Seconds (default "
                                  "EXECBOX_INSTALL_TIMEOUT, 300; the provider's max_timeout applies)")


@router.get("/api/admin/runtimes", summary="Runtime templates and their versions (admin)")
def runtimes(_: Principal = Depends(require_admin)) -> dict[str, Any]:
    return {"data": rt.list_runtimes()}


@router.get("/api/admin/runtimes/{name}", summary="One runtime template version (admin)")
def runtime(name: str = Path(max_length=80), _: Principal = Depends(require_admin)) -> dict[str, Any]:
    return rt.describe(rt.resolve(name, list_known=True))  # admin: the error may list the templates


@router.post("/v1/sandbox/sessions/{tenant_id}/{session_id}/install",
             summary="Install pip/npm packages into a session's workspace (index hosts allowed for this step only)")
def install(body: InstallIn, request: Request, tenant_id: str = _name(), session_id: str = _name(),
            principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, tenant_id)
    out = services(request).runs.install(tenant, session_id, principal.token_id, body.pip, body.npm, body.timeout)
    return {"tenant_id": tenant, "session_id": session_id, **out}
