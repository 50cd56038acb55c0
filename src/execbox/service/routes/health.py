"""/healthz (the process answers), /readyz (provider healthy and store reachable), /metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from ...errors import SandboxError
from ..container import services
from ..schemas import ErrorBody

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    provider: str
    isolation: str
    store: str
    sessions: int


@router.get("/healthz", response_model=Health, summary="Liveness: the service process answers")
async def healthz() -> Any:
    return {"status": "ok"}


def _readiness(request: Request) -> tuple[int, dict[str, Any]]:
    state = services(request)
    reasons: dict[str, str] = {}
    if not state.store.ping():
        reasons["store"] = "the settings store is not reachable"
    provider_name, isolation = "", ""
    try:
        provider = state.providers.current()
        provider_name, isolation = provider.name, provider.isolation.value
        if not provider.health_check():
            reasons["provider"] = f"provider {provider.name!r} reports unhealthy"
    except SandboxError as e:
        reasons["provider"] = e.message
    if reasons:
        message = "; ".join(f"{k}: {v}" for k, v in reasons.items())
        code = "SB001" if "provider" in reasons and not provider_name else "SB009"
        return 503, {"error": {"code": code, "message": f"not ready: {message}",
                               "details": {"reasons": reasons, "provider": provider_name}}}
    return 200, {"status": "ready", "provider": provider_name, "isolation": isolation, "store": "ok",
                 "sessions": state.sessions.count()}


@router.get("/readyz", response_model=Ready, summary="Readiness: provider healthy and store reachable",
            responses={503: {"model": ErrorBody, "description": "Not ready; details.reasons says why"}})
async def readyz(request: Request) -> Any:
    status, body = await run_in_threadpool(_readiness, request)
    return JSONResponse(body, status_code=status)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
async def metrics(request: Request) -> Response:
    m = services(request).metrics
    return Response(m.render(), media_type=m.content_type)
