"""E2B control plane (E2B_API_URL): create, get, list, kill, set_timeout, connect, pause, resume.

Shapes follow E2B's OpenAPI spec as the official SDK parses them. The API key is an execbox
token (header X-API-KEY); its tenant owns the sandboxes it creates, and another tenant's
sandbox answers 404 exactly like a missing one. Errors are E2B's {code, message} bodies so the
SDK raises its own exceptions (AuthenticationException, NotFoundException, ...).
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import parse_qsl

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ...errors import SandboxError
from ..auth import Principal, verified
from ..container import services
from ..forwarding import TARGET
from ..store.safe_text import control_character
from .registry import MAX_TIMEOUT, E2BSandbox, Registry, new_sandbox_id
from .sandbox_http import clip, parse_json
from .templates import TemplateRefused, runtime_for

router = APIRouter(tags=["e2b (control plane)"], include_in_schema=False)

DEFAULT_TIMEOUT = 300


class E2BError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def sandbox_error_response(e: SandboxError) -> JSONResponse:
    resp = error_response(e.http_status if e.http_status < 600 else 500, f"{e.code}: {e.message}")
    owner = getattr(e, "forward_to", None)  # SessionOwnedElsewhere: ForwardToOwner takes it there
    if owner:
        resp.headers[TARGET] = str(owner)
    return resp


def principal(request: Request) -> Principal:
    token = request.headers.get("x-api-key")
    if not token:
        auth = request.headers.get("authorization", "")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else None
    # the token gate (token_gate.py) verified it before the body was read: reused, not asked again
    record = (verified(request.scope, token) or services(request).store.tokens.verify(token)) if token else None
    if record is None:
        raise E2BError(401, "invalid or missing API key (use an execbox token as E2B_API_KEY)")
    return Principal(token_id=record.id, tenant_id=record.tenant_id, role=record.role)


def registry(request: Request) -> Registry:
    reg = services(request).e2b
    assert reg is not None, "e2b_compat.install() sets services.e2b"
    return reg


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = parse_json(await request.body())
    except ValueError as e:
        raise E2BError(400, str(e)) from None
    if not isinstance(body, dict):
        raise E2BError(400, "request body must be a JSON object")
    return body


MAX_MAP_BYTES = 16 * 1024
"""Most bytes of a sandbox's metadata, and of its env vars (JSON): every replica reads them."""


def _str_map(value: Any, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise E2BError(400, f"{field} must map strings to strings")
    if len(json.dumps(value).encode()) > MAX_MAP_BYTES:
        raise E2BError(400, f"{field} is larger than {MAX_MAP_BYTES} bytes")
    return dict(value)


def _timeout(value: Any, default: int = DEFAULT_TIMEOUT, field: str = "timeout") -> int:
    """Seconds from 0 to MAX_TIMEOUT; anything else is 400, as E2B's API refuses a timeout over
    its maximum ("Timeout cannot be greater than 24 hours") rather than capping it."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise E2BError(400, f"{field} must be a non-negative integer of seconds")
    if value > MAX_TIMEOUT:
        raise E2BError(400, f"{field.capitalize()} cannot be greater than {MAX_TIMEOUT // 3600} hours "
                            f"({MAX_TIMEOUT} seconds)")
    return value


async def _owned(request: Request, sandbox_id: str, who: Principal) -> E2BSandbox:
    sb = await anyio.to_thread.run_sync(registry(request).owned, sandbox_id, who.tenant_id)  # may read the store
    if sb is None:
        raise E2BError(404, f"sandbox {clip(sandbox_id)} not found")
    return sb


async def _guard(request: Request, fn: Any) -> Response:
    try:
        return await fn(principal(request))
    except E2BError as e:
        return error_response(e.status, e.message)
    except SandboxError as e:
        return sandbox_error_response(e)


@router.post("/sandboxes")
@router.post("/v2/sandboxes")
async def create(request: Request) -> Response:
    async def go(who: Principal) -> Response:
        body = await _json(request)
        template = body.get("templateID")
        if not isinstance(template, str) or not template:
            raise E2BError(400, "templateID is required")
        if control_character(template):  # stored with the sandbox: PostgreSQL refuses a NUL (500)
            raise E2BError(400, "templateID must not contain control characters")
        sb = E2BSandbox(new_sandbox_id(), who.tenant_id, template,
                        _str_map(body.get("metadata"), "metadata"), _str_map(body.get("envVars"), "envVars"),
                        time.time() + _timeout(body.get("timeout")), token_id=who.token_id)
        sessions = services(request).sessions

        def start_box() -> None:
            try:
                runtime = runtime_for(template, sessions.providers.current())
            except TemplateRefused as e:
                raise E2BError(e.status, e.message) from None
            # created on first use: the box starts now, so create fails loudly here
            with sessions.session(sb.tenant_id, sb.session_id, runtime=runtime) as s:
                sb.session_created = s.created_at  # which session is this sandbox's (registry.py)

        await anyio.to_thread.run_sync(start_box)
        registry(request).add(sb)
        return JSONResponse(sb.created(), status_code=201)

    return await _guard(request, go)


@router.get("/sandboxes")
@router.get("/v2/sandboxes")
async def list_sandboxes(request: Request) -> Response:
    async def go(who: Principal) -> Response:
        wanted = dict(parse_qsl(request.query_params.get("metadata", ""), keep_blank_values=True))
        states = request.query_params.get("state")
        mine = await anyio.to_thread.run_sync(registry(request).of_tenant, who.tenant_id)
        items = [s for s in mine
                 if all(s.metadata.get(k) == v for k, v in wanted.items())]
        if states:
            wanted_states = set(states.split(","))
            items = [s for s in items if s.state in wanted_states]
        items.sort(key=lambda s: s.started_at)
        return JSONResponse([s.listed() for s in items])

    return await _guard(request, go)


@router.get("/sandboxes/{sandbox_id}")
async def get_info(request: Request, sandbox_id: str) -> Response:
    async def go(who: Principal) -> Response:
        return JSONResponse((await _owned(request, sandbox_id, who)).detail())

    return await _guard(request, go)


@router.delete("/sandboxes/{sandbox_id}")
async def kill(request: Request, sandbox_id: str) -> Response:
    async def go(who: Principal) -> Response:
        sb = await _owned(request, sandbox_id, who)
        await anyio.to_thread.run_sync(registry(request).kill, sb)
        return Response(status_code=204)

    return await _guard(request, go)


@router.post("/sandboxes/{sandbox_id}/timeout")
async def set_timeout(request: Request, sandbox_id: str) -> Response:
    async def go(who: Principal) -> Response:
        sb = await _owned(request, sandbox_id, who)
        seconds = _timeout((await _json(request)).get("timeout"), 0)
        await anyio.to_thread.run_sync(registry(request).set_deadline, sb, seconds)
        return Response(status_code=204)

    return await _guard(request, go)


@router.post("/sandboxes/{sandbox_id}/refreshes")
async def refresh(request: Request, sandbox_id: str) -> Response:
    async def go(who: Principal) -> Response:
        sb = await _owned(request, sandbox_id, who)
        body = await _json(request) if await request.body() else {}
        seconds = _timeout(body.get("duration"), 60, "duration")
        await anyio.to_thread.run_sync(registry(request).set_deadline, sb, seconds, True)  # only ever later
        return Response(status_code=204)

    return await _guard(request, go)


@router.post("/sandboxes/{sandbox_id}/connect")
@router.post("/v2/sandboxes/{sandbox_id}/connect")
async def connect(request: Request, sandbox_id: str) -> Response:
    async def go(who: Principal) -> Response:
        sb = await _owned(request, sandbox_id, who)
        body = await _json(request) if await request.body() else {}
        timeout = _timeout(body.get("timeout")) if body.get("timeout") is not None else None
        if await anyio.to_thread.run_sync(_resume_paused, request, sb, timeout):
            return JSONResponse(sb.created(), status_code=201)  # E2B: 201 when it resumed a paused one
        if timeout is not None:  # a running sandbox's deadline only ever moves later
            await anyio.to_thread.run_sync(registry(request).set_deadline, sb, timeout, True)
        return JSONResponse(sb.created(), status_code=200)

    return await _guard(request, go)


@router.get("/sandboxes/{sandbox_id}/metrics")
@router.get("/sandboxes/{sandbox_id}/logs")
@router.get("/v2/sandboxes/{sandbox_id}/logs")
async def not_yet(request: Request, sandbox_id: str) -> Response:
    async def go(who: Principal) -> Response:
        await _owned(request, sandbox_id, who)
        raise E2BError(501, "sandbox metrics and logs are not supported by execbox's E2B endpoint yet "
                            "(see /metrics and the audit log)")

    return await _guard(request, go)


@router.post("/sandboxes/{sandbox_id}/pause")
@router.post("/v2/sandboxes/{sandbox_id}/pause")
async def pause(request: Request, sandbox_id: str) -> Response:
    """The session's box stops (files kept, processes and interpreter state not: execbox takes no
    memory snapshot); 409 when already paused, as E2B answers (the SDK's ``pause()`` -> False)."""
    async def go(who: Principal) -> Response:
        sb = await _owned(request, sandbox_id, who)
        reg = registry(request)

        def stop() -> None:
            if reg.session_state(sb) == "paused":
                raise E2BError(409, f"sandbox {sandbox_id} is already paused")
            services(request).sessions.pause(sb.tenant_id, sb.session_id)
            reg.paused(sb)

        await anyio.to_thread.run_sync(stop)
        return Response(status_code=204)

    return await _guard(request, go)


@router.post("/sandboxes/{sandbox_id}/resume")
async def resume(request: Request, sandbox_id: str) -> Response:
    """E2B's older resume call: 409 when the sandbox is not paused, else 201 with the sandbox."""
    async def go(who: Principal) -> Response:
        sb = await _owned(request, sandbox_id, who)
        body = await _json(request) if await request.body() else {}
        timeout = _timeout(body.get("timeout"))
        if not await anyio.to_thread.run_sync(_resume_paused, request, sb, timeout):
            raise E2BError(409, f"sandbox {sandbox_id} is already running")
        return JSONResponse(sb.created(), status_code=201)

    return await _guard(request, go)


def _resume_paused(request: Request, sb: E2BSandbox, timeout: int | None) -> bool:
    """Start a paused sandbox's box again (its timeout: ``timeout``, else what was left of it);
    False when it was not paused."""
    reg = registry(request)
    if reg.session_state(sb) != "paused":
        return False
    services(request).sessions.resume(sb.tenant_id, sb.session_id)
    reg.resumed(sb, timeout)
    return True
