"""Packages HTTP API (issue 14 part 5): runtime templates (admin, read-only) and in-session install.

- GET  /api/admin/runtimes                                      templates and their versions (console)
- GET  /api/admin/runtimes/{name}                               one template (``NAME`` or ``NAME@vN``)
- POST /v1/sandbox/sessions/{tenant_id}/{session_id}/install    pip/npm into the session's workspace

Templates are built with the CLI (`execbox runtime build`): a build runs for minutes and writes
to the jail directory, which is an operator's step, not a request. An install runs the tenant's
packages' code in the box (build steps, npm scripts), so it takes the run path (RunService): the
tenant's execution slot (SB008 beyond ``tenant_max_executions``), the ``execbox_executions``
metric (language ``packages``) and one audit row (operation ``install``, the requirements as code).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from ...boxes import runtime as rt
from ...errors import InvalidConfigError
from ...models import ExecutionResult
from ..auth import Principal, require_admin, require_token
from ..container import services
from ..executions import INSTALL_LANGUAGE, RunSpec
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
    out: dict[str, Any] = {}

    def call(provider: Any, instance_id: str, _one_shot: bool, _on_output: Any) -> ExecutionResult:
        do = getattr(provider, "install_packages", None)
        if do is None:
            raise InvalidConfigError(f"provider {provider.name!r} does not support in-session installs; "
                                     "they work on the self-hosted providers (jail, docker)",
                                     details={"provider": provider.name})
        out.update(do(instance_id, pip=body.pip, npm=body.npm, timeout=body.timeout))
        return ExecutionResult("", "", 0, 0.0, metadata={"egress_run_id": out.get("egress_run_id")})

    code = "\n".join([*(f"pip {p}" for p in body.pip), *(f"npm {n}" for n in body.npm)])
    services(request).runs.run(RunSpec(tenant, session_id, "install", INSTALL_LANGUAGE, code, principal.token_id,
                                       call, template="python"))
    return {"tenant_id": tenant, "session_id": session_id, **out}
