"""/healthz (the process answers), /readyz (provider healthy and store reachable), /metrics."""

from __future__ import annotations

import asyncio
import logging
import time
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


READY_TTL = 2.0
"""Seconds one readiness probe answers for: /readyz needs no token, and a probe is a provider
health check (an HTTP call, a Docker ping, a Kubernetes list) on the shared worker threads."""
READY_DEADLINE = 10.0
"""A probe that has not finished by then answers 503 (it keeps running; the next waits for it)."""

log = logging.getLogger("execbox.service.health")


class _ReadyCache:
    """One probe at a time per app, its answer reused for READY_TTL: a flood of anonymous /readyz
    calls costs one worker thread, not one each."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.lock = asyncio.Lock()
        self.at = -1e9
        self.answer: tuple[int, dict[str, Any]] = (503, {})
        self.running: asyncio.Future[tuple[int, dict[str, Any]]] | None = None

    async def get(self, request: Request) -> tuple[int, dict[str, Any]]:
        async with self.lock:
            if time.monotonic() - self.at < READY_TTL:
                return self.answer
            if self.running is None or self.running.done():
                self.running = asyncio.ensure_future(run_in_threadpool(_readiness, request))
            try:
                self.answer = await asyncio.wait_for(asyncio.shield(self.running), READY_DEADLINE)
            except TimeoutError:
                self.answer = _not_ready({"provider": "the readiness check did not finish in time"}, "", "SB009")
            self.at = time.monotonic()
            return self.answer


def _readiness(request: Request) -> tuple[int, dict[str, Any]]:
    """Store and provider checked. The answer is for anyone (no token): it says what is wrong
    in general terms; the detail (hosts, addresses, driver text) goes to the log."""
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
        log.warning("not ready: %s", e.message)
        reasons["provider"] = f"{e.code}: the provider is unavailable (the server log has the details)"
    if state.sessions.fenced():
        reasons["sessions"] = ("this replica cannot renew its session leases (fenced): it serves no session "
                               "until it can")
    if reasons:
        return _not_ready(reasons, provider_name)
    return 200, {"status": "ready", "provider": provider_name, "isolation": isolation, "store": "ok",
                 "sessions": state.sessions.count()}


def _not_ready(reasons: dict[str, str], provider_name: str, code: str | None = None) -> tuple[int, dict[str, Any]]:
    message = "; ".join(f"{k}: {v}" for k, v in reasons.items())
    code = code or ("SB001" if "provider" in reasons and not provider_name else "SB009")
    return 503, {"error": {"code": code, "message": f"not ready: {message}",
                           "details": {"reasons": reasons, "provider": provider_name}}}


@router.get("/readyz", response_model=Ready, summary="Readiness: provider healthy and store reachable",
            responses={503: {"model": ErrorBody, "description": "Not ready; details.reasons says why"}})
async def readyz(request: Request) -> Any:
    cache = getattr(request.app.state, "ready_cache", None)
    if cache is None or cache.loop is not asyncio.get_running_loop():
        cache = request.app.state.ready_cache = _ReadyCache()
    status, body = await cache.get(request)
    return JSONResponse(body, status_code=status)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
async def metrics(request: Request) -> Response:
    m = services(request).metrics
    return Response(m.render(), media_type=m.content_type)
