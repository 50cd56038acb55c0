"""RAGFlow executor_manager compatible API: ``POST /run`` and the executor ``GET /healthz``.

Request and response shapes are RAGFlow's, so RAGFlow (or anything written against its
executor) can point at execbox unchanged. Differences, all additive: the run happens on the
active provider (jail by default) with a fresh box per call, ``memory_used_kb`` is filled,
failures of the runner itself get a real HTTP status plus the SB error, and the response says
which ``isolation`` tier ran the code.

Served inside ``execbox serve`` (through the service's one-shot path: ``app.state.executor``, so
quotas, metrics and the audit log apply; the provider is ``app.state.providers.current()``) and
standalone by ``create_executor_app`` for ``execbox executor --port 9385``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool

from ...errors import (
    CodeBlockedError,
    InvalidConfigError,
    PayloadTooLargeError,
    ProviderNotInitializedError,
    SandboxError,
)
from ...models import ExecutionResult
from ...providers.base import SandboxProvider
from ...settings import sandbox_timeout
from ..auth import AuthError, authenticate, bearer_token

log = logging.getLogger("execbox.executor")

MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_ARTIFACT_BYTES = 64 * 1024 * 1024  # total artifact bytes returned inline by one /run
EXECUTOR_TENANT = "executor"
RUNNER_ERROR_EXIT = -999  # RAGFlow's exit_code for a runner (not program) failure


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


# -- mapping ExecutionResult -> /run ------------------------------------------------------------

_NETWORK_MARKERS = ("Network is unreachable", "ENETUNREACH", "Temporary failure in name resolution",
                    "Name or service not known", "EAI_AGAIN", "getaddrinfo ENOTFOUND")
_FILE_MARKERS = ("Permission denied", "PermissionError", "EACCES", "Read-only file system", "EROFS")
_MEMORY_MARKERS = ("MemoryError", "JavaScript heap out of memory", "Cannot allocate memory")


def _stderr_tail(stderr: str, lines: int = 3) -> str:
    return "\n".join([ln for ln in stderr.splitlines() if ln.strip()][-lines:])


def classify(result: ExecutionResult) -> dict[str, Any]:
    """status, the three *_type fields and detail for one ExecutionResult."""
    out: dict[str, Any] = {"status": "success", "resource_limit_type": None, "unauthorized_access_type": None,
                           "runtime_error_type": None, "detail": None}
    sig = result.metadata.get("signal")
    tail = _stderr_tail(result.stderr)
    if result.timed_out or result.error_code == "SB005":
        out.update(status="resource_limit_exceeded", resource_limit_type="time",
                   detail=result.metadata.get("error_message") or "execution timed out")
    elif result.error_code == "SB006" or (result.exit_code != 0 and any(m in tail for m in _MEMORY_MARKERS)):
        out.update(status="resource_limit_exceeded", resource_limit_type="memory",
                   detail=result.metadata.get("error_message") or "execution ran out of memory")
    elif sig == signal.SIGSYS:
        out.update(status="unauthorized_access", unauthorized_access_type="disallowed_syscall",
                   detail="killed by SIGSYS: a system call the sandbox does not allow")
    elif result.exit_code != 0:
        if any(m in tail for m in _NETWORK_MARKERS):
            out.update(status="unauthorized_access", unauthorized_access_type="network_access",
                       detail="network access is not allowed in this sandbox")
        elif "Operation not permitted" in tail or "EPERM" in tail:
            out.update(status="unauthorized_access", unauthorized_access_type="disallowed_syscall",
                       detail="operation not permitted by the sandbox")
        elif any(m in tail for m in _FILE_MARKERS):
            out.update(status="unauthorized_access", unauthorized_access_type="file_access",
                       detail="file access denied by the sandbox")
        elif sig or result.exit_code < 0:
            name = _signal_name(sig or -result.exit_code)
            out.update(status="runtime_error", runtime_error_type="signalled", detail=f"killed by {name}")
        else:
            out.update(status="program_error", runtime_error_type="nonzero_exit",
                       detail=f"exited with code {result.exit_code}")
    elif result.truncated:
        out.update(status="resource_limit_exceeded", resource_limit_type="output",
                   detail="output exceeded the cap and was truncated")
    return out


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _artifact_items(result: ExecutionResult) -> tuple[list[dict[str, Any]], list[str]]:
    items, problems, budget = [], [], MAX_ARTIFACT_BYTES
    for a in result.artifacts:
        try:
            data = a.read_bytes()  # inline bytes, or fetched while the instance still exists
        except SandboxError as e:
            problems.append(f"{a.name}: {e.message}")
            continue
        if len(data) > budget:
            problems.append(f"{a.name}: skipped, artifacts exceed {MAX_ARTIFACT_BYTES} bytes in total")
            continue
        budget -= len(data)
        items.append({"name": a.name, "mime_type": a.mime_type, "size": len(data),
                      "content_b64": base64.b64encode(data).decode("ascii")})
    return items, problems


def result_to_response(result: ExecutionResult, artifacts: list[dict[str, Any]] | None = None,
                       artifact_problems: list[str] | None = None) -> dict[str, Any]:
    """The /run response body for an ExecutionResult (artifacts already read)."""
    fields = classify(result)
    if artifact_problems:
        note = "artifacts not returned: " + "; ".join(artifact_problems)
        fields["detail"] = f"{fields['detail']}; {note}" if fields["detail"] else note
    present = bool(result.metadata.get("result_present", result.result is not None))
    peak = result.metadata.get("peak_memory_kb")
    body = {
        **fields,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "exit_code": result.exit_code,
        "time_used_ms": round(result.execution_time * 1000, 3),
        "memory_used_kb": float(peak) if peak is not None else None,
        "artifacts": artifacts or [],
        "result": {"present": present, "value": result.result if present else None,
                   "type": (result.metadata.get("result_type") or "json") if present else "json"},
        "isolation": result.metadata.get("isolation"),
    }
    return body


def runner_error_response(err: SandboxError) -> JSONResponse:
    """A failure of the runner (not of the program): RAGFlow's shape, a real HTTP status, the SB error."""
    if isinstance(err, CodeBlockedError):
        stderr, detail = f"Line {err.details.get('line', 0)}: {err.message}", "Code is unsafe"
    else:
        stderr, detail = err.message, f"{err.code}: {err.message}"
    body = {"status": "program_runner_error", "stdout": "", "stderr": stderr, "exit_code": RUNNER_ERROR_EXIT,
            "detail": detail, "time_used_ms": None, "memory_used_kb": None, "resource_limit_type": None,
            "unauthorized_access_type": None, "runtime_error_type": None, "artifacts": [], "result": None,
            "isolation": None, **err.to_dict()}
    return JSONResponse(body, status_code=err.http_status)


def _validation_response(errors: list[dict[str, Any]]) -> JSONResponse:
    """422 with FastAPI's ``detail`` list (what RAGFlow's executor answers) plus the SB002 error."""
    detail = []
    for e in errors:
        item = {"type": e.get("type"), "loc": ["body", *e.get("loc", ())], "msg": e.get("msg")}
        if e.get("ctx"):
            item["ctx"] = {k: str(v) for k, v in e["ctx"].items()}
        detail.append(item)
    fields = {".".join(str(p) for p in d["loc"][1:]) or "body": d["msg"] for d in detail}
    err = InvalidConfigError("invalid /run request: " + "; ".join(f"{k}: {v}" for k, v in fields.items()),
                             details={"fields": fields}, http_status=422)
    return JSONResponse({"detail": detail, **err.to_dict()}, status_code=422)


# -- auth -----------------------------------------------------------------------------------------

def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ExecutorAuth:
    """How /run authenticates. ``open``: no token (loopback bind or explicit flag).
    ``token``: a static bearer token; otherwise tokens come from ``app.state.store``."""

    open: bool = False
    token: str | None = None

    @classmethod
    def for_bind(cls, host: str, *, allow_unauthenticated: bool = False,
                 token: str | None = None) -> ExecutorAuth:
        return cls(open=not token and (allow_unauthenticated or is_loopback(host)), token=token or None)


def authorize(request: Request) -> tuple[str, str | None]:
    """(tenant, token id) a /run request runs as; raises 401 (SB002) without a valid token."""
    auth = getattr(request.app.state, "executor_auth", None) or ExecutorAuth()
    if auth.open:
        return EXECUTOR_TENANT, None
    if auth.token:
        given = bearer_token(request)
        if given is None or not hmac.compare_digest(given.encode(), auth.token.encode()):
            raise AuthError("missing or invalid bearer token for /run", details={"header": "Authorization"})
        return EXECUTOR_TENANT, None
    principal = authenticate(request)
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
    holder = getattr(request.app.state, "providers", None)
    if holder is None:
        raise ProviderNotInitializedError("no sandbox provider is configured for /run")
    return holder.current()


def _default_timeout(provider: SandboxProvider) -> float:
    t = provider.config.get("timeout")
    return float(t) if t else sandbox_timeout()


def _execute(provider: SandboxProvider, instance_id: str, req: RunRequest, code: str
             ) -> tuple[ExecutionResult, list[dict[str, Any]], list[str]]:
    timeout = req.timeout if req.timeout is not None else _default_timeout(provider)
    result = provider.execute_code(instance_id, code, req.language.value, timeout, req.arguments or {},
                                   inline_artifacts=True)
    artifacts, problems = _artifact_items(result)  # while the instance still exists
    return result, artifacts, problems


def run_once(provider: SandboxProvider, req: RunRequest, tenant_id: str) -> dict[str, Any]:
    """One-shot: create an instance, run, read artifacts, always destroy."""
    code = base64.b64decode(req.code_b64).decode("utf-8")
    inst = provider.create_instance(template=req.language.value, tenant_id=tenant_id)
    try:
        result, artifacts, problems = _execute(provider, inst.instance_id, req, code)
    finally:
        provider.destroy_instance(inst.instance_id)
    return result_to_response(result, artifacts, problems)


def run_in_service(service_executor: Any, req: RunRequest, tenant_id: str, token_id: str | None,
                   max_code_bytes: int | None) -> dict[str, Any]:
    """Inside `execbox serve`: the service's one-shot path (quota slot, metrics, audit log)."""
    from ..executions import RunSpec

    code = base64.b64decode(req.code_b64).decode("utf-8")
    if max_code_bytes and len(code.encode()) > max_code_bytes:
        raise PayloadTooLargeError(f"code is larger than {max_code_bytes} bytes",
                                   details={"field": "code_b64", "max_bytes": max_code_bytes})
    read: dict[str, Any] = {}

    def call(provider: SandboxProvider, instance_id: str, one_shot: bool, on_output: Any) -> ExecutionResult:
        result, read["artifacts"], read["problems"] = _execute(provider, instance_id, req, code)
        return result

    spec = RunSpec(tenant_id, None, "execute_code", req.language.value, code, token_id, call)
    result = service_executor.run(spec)
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
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > MAX_BODY_BYTES:
        return runner_error_response(PayloadTooLargeError(
            f"request body of {length} bytes exceeds {MAX_BODY_BYTES}",
            details={"max_bytes": MAX_BODY_BYTES}))
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        return runner_error_response(PayloadTooLargeError(
            f"request body exceeds {MAX_BODY_BYTES} bytes", details={"max_bytes": MAX_BODY_BYTES}))
    try:
        payload = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        return _validation_response([{"type": "json_invalid", "loc": (), "msg": f"JSON decode error: {e}"}])
    try:
        req = RunRequest.model_validate(payload)
    except ValidationError as e:
        return _validation_response(e.errors(include_url=False, include_input=False))
    service_executor = getattr(request.app.state, "executor", None)
    try:
        if service_executor is not None:
            settings = getattr(request.app.state, "settings", None)
            body = await run_in_threadpool(run_in_service, service_executor, req, tenant_id, token_id,
                                           getattr(settings, "max_code_bytes", None))
        else:
            provider = _current_provider(request)
            body = await run_in_threadpool(run_once, provider, req, tenant_id)
    except SandboxError as e:
        return runner_error_response(e)
    except Exception as e:  # noqa: BLE001 - report, never drop: a runner bug is still an answer
        log.exception("/run failed unexpectedly")
        return runner_error_response(SandboxError(f"unhandled runner error: {type(e).__name__}: {e}"))
    return JSONResponse(body)


def create_executor_app(provider: SandboxProvider, *, auth: ExecutorAuth | None = None,
                        owns_provider: bool = True) -> FastAPI:
    """The standalone app behind ``execbox executor``: /run and /healthz only.

    ``auth`` defaults to open (the CLI decides from the bind address); with ``owns_provider``
    the provider is shut down when the app stops.
    """
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if owns_provider:
            provider.shutdown()

    app = FastAPI(title="execbox executor", description="RAGFlow executor_manager compatible /run API",
                  version="1", lifespan=lifespan)
    app.state.providers = StaticProviders(provider)
    app.state.executor_auth = auth or ExecutorAuth(open=True)
    app.include_router(router)

    @app.exception_handler(SandboxError)
    async def _sandbox_error(_: Request, exc: SandboxError) -> JSONResponse:
        return JSONResponse(exc.to_dict(), status_code=exc.http_status)

    return app
