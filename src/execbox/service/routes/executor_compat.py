"""RAGFlow executor_manager compatible API: ``POST /run`` and the executor ``GET /healthz``.

Request and response shapes are RAGFlow's, so RAGFlow (or anything written against its
executor) can point at execbox unchanged. Differences, all additive: the run happens on the
active provider (jail by default) with a fresh box per call, ``memory_used_kb`` is filled,
failures of the runner itself get a real HTTP status plus the SB error, and the response says
which ``isolation`` tier ran the code.

Served inside ``execbox serve`` (through the service's one-shot path: ``ExecutorDeps.runs``, so
quotas, metrics and the audit log apply; the provider is ``ExecutorDeps.providers.current()``) and
standalone by ``create_executor_app`` for ``execbox executor --port 9385``.

Open mode (no token) answers programs, not web pages: executor_access.py says who may call it.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...errors import (
    PayloadTooLargeError,
    ProviderNotInitializedError,
    SandboxError,
)
from ...models import ExecutionResult
from ...providers.base import SandboxProvider
from ...settings import sandbox_timeout
from ..auth import AuthError, authenticate, bearer_token
from ..errors import BodyLimit
from ..executions import run_timeout
from ..metrics import ServiceMetrics
from .executor_access import LOOPBACK_HOSTS, ExecutorAuth, is_loopback, open_mode_refusal
from .executor_results import (
    RUNNER_ERROR_EXIT,
    artifact_items,
    classify,
    max_artifact_bytes_from_env,
    result_to_response,
    runner_error_response,
    validation_response,
)

__all__ = ["LOOPBACK_HOSTS", "RUNNER_ERROR_EXIT", "ExecutorAuth", "RunRequest",
           "StaticProviders", "classify", "create_executor_app", "is_loopback", "result_to_response", "router",
           "runner_error_response"]

log = logging.getLogger("execbox.executor")

MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_JSON_DEPTH = 256
"""Deepest nesting a /run body may have (the body object is level 1). Deeper JSON is a 422
json_invalid before anything recursive (validation, the provider, the echoed result) sees it."""
EXECUTOR_TENANT = "executor"


class SupportLanguage(StrEnum):
    PYTHON = "python"
    NODEJS = "nodejs"


class RunRequest(BaseModel):
    """RAGFlow's CodeExecutionRequest, plus an optional ``timeout`` (seconds; RAGFlow ignores it)."""

    code_b64: str = Field(..., description="Base64 encoded code string")
    language: SupportLanguage = Field(default=SupportLanguage.PYTHON, description="Programming language")
    arguments: dict[str, Any] | None = Field(default_factory=dict, description="Arguments for main()")
    timeout: float | None = Field(default=None, gt=0, description="execbox extension: timeout in seconds")

    @field_validator("code_b64")
    @classmethod
    def _valid_base64(cls, v: str) -> str:
        try:
            raw = base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ValueError(f"Invalid base64 encoding: {e}") from None
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"decoded code is not UTF-8: {e}") from None
        return v


class ArtifactItem(BaseModel):
    name: str
    mime_type: str
    size: int
    content_b64: str


class StructuredResult(BaseModel):
    present: bool
    value: Any = None
    type: str = "json"


class RunResponse(BaseModel):
    """RAGFlow's CodeExecutionResult; ``isolation`` and ``error`` are execbox additions."""

    status: str
    stdout: str
    stderr: str
    exit_code: int
    detail: str | None = None
    time_used_ms: float | None = None
    memory_used_kb: float | None = None
    resource_limit_type: str | None = None
    unauthorized_access_type: str | None = None
    runtime_error_type: str | None = None
    artifacts: list[ArtifactItem] = []
    result: StructuredResult | None = None
    isolation: str | None = None
    error: dict[str, Any] | None = None


# -- auth -----------------------------------------------------------------------------------------

@dataclass
class ExecutorDeps:
    """What /run and /healthz need: built by create_app (inside the service: ``runs`` set, so
    quotas, metrics and audit apply) or by create_executor_app (standalone: one provider)."""

    providers: Any
    """Anything with ``current()``: the service's ProviderManager, or StaticProviders."""
    auth: ExecutorAuth = field(default_factory=ExecutorAuth)
    runs: Any = None
    """The service's RunService; None in the standalone app (runs go straight to the provider)."""
    store: Any = None
    """Token store for per-tenant tokens; None in the standalone app."""
    max_code_bytes: int | None = None
    max_artifact_bytes: int = field(default_factory=max_artifact_bytes_from_env)
    """EXECBOX_EXECUTOR_MAX_ARTIFACT_BYTES, read when the app is built (executor_results.py)."""


def executor_deps(request: Request) -> ExecutorDeps:
    """The app's ExecutorDeps (``app.state.executor``)."""
    return request.app.state.executor


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether parsed JSON nests deeper than ``limit`` levels (iterative: no recursion limit)."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


async def read_body(request: Request) -> bytes | None:
    """The request body, or None once it passes MAX_BODY_BYTES (counted while streaming, never
    buffered past the limit; BodyLimit in front may cut it off first: same answer)."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                return None
            chunks.append(chunk)
    except StarletteHTTPException as e:
        if e.status_code == 413:
            return None
        raise
    return b"".join(chunks)


def authorize(request: Request) -> tuple[str, str | None]:
    """(tenant, token id) a /run request runs as; raises 401 (SB002) without a valid token."""
    deps = executor_deps(request)
    auth = deps.auth
    if auth.open:
        return EXECUTOR_TENANT, None
    if auth.token:
        given = bearer_token(request)
        if given is None or not hmac.compare_digest(given.encode(), auth.token.encode()):
            raise AuthError("missing or invalid bearer token for /run", details={"header": "Authorization"})
        return EXECUTOR_TENANT, None
    principal = authenticate(request, deps.store)
    return principal.tenant_id, principal.token_id


# -- provider lookup ------------------------------------------------------------------------------

class StaticProviders:
    """The ``providers`` holder of the standalone executor app: one provider, chosen at start."""

    def __init__(self, provider: SandboxProvider) -> None:
        self.provider = provider
        self.version = 0.0

    def current(self) -> SandboxProvider:
        return self.provider

    def candidates(self) -> list[SandboxProvider]:
        return [self.provider]


def _current_provider(request: Request) -> SandboxProvider:
    holder = executor_deps(request).providers
    if holder is None:
        raise ProviderNotInitializedError("no sandbox provider is configured for /run")
    return holder.current()


def _execute(provider: SandboxProvider, instance_id: str, req: RunRequest, code: str, max_artifact_bytes: int
             ) -> tuple[ExecutionResult, list[dict[str, Any]], list[str]]:
    timeout = run_timeout(provider, req.timeout, sandbox_timeout())
    result = provider.execute_code(instance_id, code, req.language.value, timeout, req.arguments or {},
                                   inline_artifacts=True)
    artifacts, problems = artifact_items(result, max_artifact_bytes)  # while the instance still exists
    return result, artifacts, problems


def run_once(provider: SandboxProvider, req: RunRequest, tenant_id: str,
             max_artifact_bytes: int) -> dict[str, Any]:
    """One-shot: create an instance, run, read artifacts, always destroy."""
    code = base64.b64decode(req.code_b64).decode("utf-8")
    inst = provider.create_instance(template=req.language.value, tenant_id=tenant_id)
    try:
        result, artifacts, problems = _execute(provider, inst.instance_id, req, code, max_artifact_bytes)
    finally:
        provider.destroy_instance(inst.instance_id)
    return result_to_response(result, artifacts, problems)


def run_in_service(runs: Any, req: RunRequest, tenant_id: str, token_id: str | None,
                   max_code_bytes: int | None, max_artifact_bytes: int) -> dict[str, Any]:
    """Inside `execbox serve`: the service's one-shot path (quota slot, metrics, audit log)."""
    from ..executions import RunSpec

    code = base64.b64decode(req.code_b64).decode("utf-8")
    if max_code_bytes and len(code.encode()) > max_code_bytes:
        raise PayloadTooLargeError(f"code is larger than {max_code_bytes} bytes",
                                   details={"field": "code_b64", "max_bytes": max_code_bytes})
    read: dict[str, Any] = {}

    def call(provider: SandboxProvider, instance_id: str, one_shot: bool, on_output: Any) -> ExecutionResult:
        result, read["artifacts"], read["problems"] = _execute(provider, instance_id, req, code,
                                                               max_artifact_bytes)
        return result

    spec = RunSpec(tenant_id, None, "execute_code", req.language.value, code, token_id, call)
    result = runs.run(spec)
    return result_to_response(result, read.get("artifacts"), read.get("problems"))


# -- routes ---------------------------------------------------------------------------------------

router = APIRouter(tags=["executor"])


@router.get("/healthz", summary="Executor health (RAGFlow shape)")
async def healthz(request: Request) -> JSONResponse:
    try:
        provider = _current_provider(request)
        healthy = await run_in_threadpool(provider.health_check)
    except SandboxError as e:
        return JSONResponse({"status": "unavailable", "detail": e.message}, status_code=503)
    if not healthy:
        return JSONResponse({"status": "unavailable", "detail": f"provider {provider.name!r} is not healthy"},
                            status_code=503)
    return JSONResponse({"status": "ok"})


@router.post("/run", summary="Run code once (RAGFlow executor_manager API)", response_model=RunResponse,
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": RunRequest.model_json_schema()}}}})
async def run(request: Request) -> JSONResponse:
    try:
        tenant_id, token_id = authorize(request)
    except SandboxError as e:
        return JSONResponse(e.to_dict(), status_code=e.http_status, headers={"WWW-Authenticate": "Bearer"})
    if (auth := executor_deps(request).auth).open and (refusal := open_mode_refusal(request, auth)) is not None:
        return runner_error_response(refusal)
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > MAX_BODY_BYTES:
        return too_large(size=int(length))
    raw = await read_body(request)
    if raw is None:
        return too_large()
    try:
        payload = json.loads(raw)
    except RecursionError:
        return validation_response([{"type": "json_invalid", "loc": (),
                                     "msg": "JSON decode error: nested too deeply"}])
    except (ValueError, UnicodeDecodeError) as e:
        return validation_response([{"type": "json_invalid", "loc": (), "msg": f"JSON decode error: {e}"}])
    if _deeper_than(payload, MAX_JSON_DEPTH):
        return validation_response([{"type": "json_invalid", "loc": (),
                                     "msg": f"JSON decode error: nested deeper than {MAX_JSON_DEPTH} levels"}])
    try:
        req = RunRequest.model_validate(payload)
    except ValidationError as e:
        return validation_response(e.errors(include_url=False, include_input=False))
    deps = executor_deps(request)
    try:
        if deps.runs is not None:
            body = await run_in_threadpool(run_in_service, deps.runs, req, tenant_id, token_id,
                                           deps.max_code_bytes, deps.max_artifact_bytes)
        else:
            provider = _current_provider(request)
            body = await run_in_threadpool(run_once, provider, req, tenant_id, deps.max_artifact_bytes)
    except SandboxError as e:
        return runner_error_response(e)
    except Exception as e:  # noqa: BLE001 - report, never drop: a runner bug is still an answer
        log.exception("/run failed unexpectedly")
        return runner_error_response(SandboxError(f"unhandled runner error: {type(e).__name__}: {e}"))
    try:
        return JSONResponse(body)
    except (RecursionError, ValueError) as e:  # a result too deep (or not finite) to encode
        log.warning("/run result could not be encoded: %s", e)
        return runner_error_response(SandboxError(f"the run's result could not be encoded as JSON: {e}",
                                                  details={"field": "result"}))


def too_large(_: PayloadTooLargeError | None = None, *, size: int | None = None) -> JSONResponse:
    """The 413 of a /run body over MAX_BODY_BYTES, in the /run shape (``status:
    "program_runner_error"``, ``error.code: "SB002"``), whoever finds it: the route (declared or
    counted length) or, in front of it, BodyLimit (``shapes``: the service's SANDBOX_MAX_REQUEST_BYTES,
    the standalone executor's own 32 MiB): one answer for one limit in both apps."""
    what = f"request body of {size} bytes" if size is not None else "request body"
    response = runner_error_response(PayloadTooLargeError(
        f"{what} exceeds the /run limit of {MAX_BODY_BYTES} bytes",
        details={"field": "body", "limit": MAX_BODY_BYTES, "max_bytes": MAX_BODY_BYTES}))
    response.headers["Connection"] = "close"  # the rest of the body is never read
    return response


BODY_SHAPES = {"/run": too_large}
"""BodyLimit's ``shapes`` for an app that serves /run."""


def create_executor_app(provider: SandboxProvider, *, auth: ExecutorAuth | None = None,
                        owns_provider: bool = True) -> FastAPI:
    """The standalone app behind ``execbox executor``: /run and /healthz only.

    ``auth`` defaults to open (the CLI decides from the bind address); with ``owns_provider``
    the provider is shut down when the app stops. Like the service, BodyLimit bounds every
    request body (declared or streamed) before any route reads it.
    """

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if owns_provider:
            provider.shutdown()

    app = FastAPI(title="execbox executor", description="RAGFlow executor_manager compatible /run API",
                  version="1", lifespan=lifespan)
    app.state.executor = ExecutorDeps(StaticProviders(provider), auth or ExecutorAuth(open=True))
    app.include_router(router)
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES, metrics=ServiceMetrics(), shapes=BODY_SHAPES)

    @app.exception_handler(SandboxError)
    async def _sandbox_error(_: Request, exc: SandboxError) -> JSONResponse:
        return JSONResponse(exc.to_dict(), status_code=exc.http_status)

    return app
