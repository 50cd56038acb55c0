"""The gateway API (code-sandbox-gateway.md): execute, bash, files, sessions.

Mounted twice by create_app: under /v1/sandbox (public) and bare (direct service paths).
Every route authenticates; a tenant token is confined to its own tenant (403 otherwise).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse, Response

from ...agent.paths import PathViolation, check_syntax
from ...errors import ERRORS_BY_CODE, InvalidConfigError, PathError, PayloadTooLargeError, SandboxError
from ...models import GlobResult, GrepResult, Language
from ...providers.base import OutputCallback, SandboxProvider
from .. import disconnect, egress_hook
from ..auth import ForbiddenError, Principal, require_token
from ..container import services
from ..executions import ClientGone, RunService, RunSpec, result_body, run_timeout
from ..schemas import (
    ERROR_RESPONSES,
    BashRequest,
    BinaryOut,
    CopyRequest,
    ExecuteRequest,
    ExecutionOut,
    FileInfoOut,
    FilesOut,
    GlobOut,
    GlobRequest,
    GrepOut,
    GrepRequest,
    ListRequest,
    ReadBinaryRequest,
    ReadRequest,
    TextPageOut,
    WhoAmI,
    WriteRequest,
)
from ..sessions import NAME_PATTERN
from ..streaming import RunHandle, stream_run, wants_stream

router = APIRouter(responses=ERROR_RESPONSES)

STREAM_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {"description": "The ExecutionResult; or server-sent events stdout, stderr, artifact, result, error "
                         "with Accept: text/event-stream or stream: true",
          "content": {"text/event-stream": {"schema": {
              "type": "object", "required": ["event", "data"],
              "properties": {
                  "event": {"type": "string", "enum": ["stdout", "stderr", "artifact", "result", "error"]},
                  "data": {"type": "string", "contentMediaType": "application/json",
                           "description": "stdout/stderr: {text}; artifact: metadata + url; result: the "
                                          "ExecutionResult; error: {code, message, details}"},
              }}}}},
}


def tenant_for(principal: Principal, tenant_id: str | None) -> str:
    """The tenant a request acts on: the token's own, or any for an admin token."""
    if tenant_id is None or tenant_id == principal.tenant_id:
        return principal.tenant_id
    if principal.is_admin:
        return tenant_id
    raise ForbiddenError("this token may only access its own tenant's sessions",
                         details={"field": "tenant_id", "token_tenant_id": principal.tenant_id})


def _runs(request: Request) -> RunService:
    return services(request).runs


def _check_size(text: str, field: str, limit: int) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise PayloadTooLargeError(f"{field} is {size} bytes; the limit is {limit}",
                                   details={"field": field, "size": size, "limit": limit})


def _decode(content: str | None, content_b64: str | None, field: str, limit: int) -> str | bytes:
    """The content of a write (``field``: "" or "files.N." of a copy), at most ``limit`` bytes."""
    if (content is None) == (content_b64 is None):
        where = f"{field.rstrip('.')}: " if field else ""
        raise InvalidConfigError(f"{where}give exactly one of content or content_b64",
                                 details={"field": f"{field}content"})
    if content is not None:
        _check_size(content, f"{field}content", limit)
        return content
    assert content_b64 is not None
    if len(content_b64) > (limit // 3 + 2) * 4:  # surely too large: refused before decoding
        raise PayloadTooLargeError(f"{field}content_b64 decodes to more than {limit} bytes",
                                   details={"field": f"{field}content_b64", "limit": limit})
    try:
        data = base64.b64decode(content_b64, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidConfigError(f"{field}content_b64 is not valid base64",
                                 details={"field": f"{field}content_b64"}) from None
    if len(data) > limit:
        raise PayloadTooLargeError(f"{field}content_b64 decodes to {len(data)} bytes; the limit is {limit}",
                                   details={"field": f"{field}content_b64", "size": len(data), "limit": limit})
    return data


def check_path(value: str | None, field: str) -> None:
    """Early check with the one path validator, so a bad path or pattern never reaches a box."""
    if value is None or value in ("", "."):
        return
    try:
        check_syntax(value)
    except PathViolation as e:
        raise PathError(str(e), details={"field": field, "violation": e.reason}) from None


def _artifact_url(request: Request) -> str:
    prefix = "/v1/sandbox" if request.url.path.startswith("/v1/sandbox/") else ""
    return f"{prefix}/read_binary"


# -- execution -------------------------------------------------------------------------------------


@router.post("/execute", response_model=ExecutionOut, responses=STREAM_RESPONSE,
             summary="Run code (python, javascript, bash) in a session or one-shot")
def execute(body: ExecuteRequest, request: Request, principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, body.tenant_id)
    settings = services(request).settings
    _check_size(body.code, "code", settings.max_code_bytes)
    language = Language.parse(body.language).value
    if body.context_id is not None and body.session_id is None:
        raise InvalidConfigError("context_id needs a session_id (contexts live in a session)",
                                 details={"field": "context_id"})

    def call(provider: SandboxProvider, instance_id: str, one_shot: bool,
             on_output: OutputCallback | None) -> Any:
        kwargs: dict[str, Any] = {"inline_artifacts": one_shot}
        if body.context_id is not None:
            kwargs["context_id"] = body.context_id
        if on_output is not None:
            kwargs["on_output"] = on_output
        return egress_hook.for_run(provider, instance_id, tenant, body.network, lambda: provider.execute_code(
            instance_id, body.code, language, run_timeout(provider, body.timeout, settings.default_timeout),
            body.arguments, **kwargs))  # issue 14: per-run network narrowing

    spec = RunSpec(tenant, body.session_id, "execute_code", language, body.code, principal.token_id, call,
                   runtime=body.runtime)
    return _respond(request, spec, body.stream)


@router.post("/bash", response_model=ExecutionOut, responses=STREAM_RESPONSE,
             summary="Run a shell command in a session's workspace or one-shot")
def bash(body: BashRequest, request: Request, principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, body.tenant_id)
    settings = services(request).settings
    _check_size(body.command, "command", settings.max_code_bytes)
    if not body.command.strip():
        raise InvalidConfigError("command must not be empty", details={"field": "command"})

    def call(provider: SandboxProvider, instance_id: str, one_shot: bool,
             on_output: OutputCallback | None) -> Any:
        return egress_hook.for_run(provider, instance_id, tenant, body.network, lambda: provider.run_command(
            instance_id, body.command, run_timeout(provider, body.timeout, settings.default_timeout),
            cwd=body.cwd, env=body.env, on_output=on_output))  # issue 14: per-run network narrowing

    spec = RunSpec(tenant, body.session_id, "run_command", "bash", body.command, principal.token_id, call,
                   runtime=body.runtime)
    return _respond(request, spec, body.stream)


def _respond(request: Request, spec: RunSpec, stream: bool) -> Any:
    runs = _runs(request)
    if wants_stream(request.headers.get("accept"), stream):
        if spec.session_id is not None:  # another replica's session: forwarded before the 200 goes out
            runs.sessions.check_owner(spec.tenant_id, spec.session_id)
        return stream_run(runs.stream(spec, _artifact_url(request)))
    handle = RunHandle()
    gone = disconnect.of(request.scope)  # a client that leaves cancels its run (disconnect.py)
    if gone is not None:
        gone.on_gone(handle.cancel)
    try:
        result = runs.run(spec, None, handle)
    except ClientGone:
        return Response(status_code=499)  # nobody reads it: nginx's "client closed request"
    finally:
        handle.done.set()
    body = result_body(result, spec)
    if result.error_code:  # SB005 / SB006: the SB status, with the partial result kept in details
        cls = ERRORS_BY_CODE.get(result.error_code, SandboxError)
        raise cls(result.metadata.get("error_message", result.error_code), details={"result": body})
    return JSONResponse(body)  # already JSON-shaped: skip re-validation on the hot path (schema-tested)


# -- files -----------------------------------------------------------------------------------------


@router.post("/read", response_model=TextPageOut, summary="Read a text file, paged by lines")
def read(body: ReadRequest, request: Request, principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, body.tenant_id)
    check_path(body.path, "path")
    page = _runs(request).file_op(tenant, body.session_id, "read_file", body.path, principal.token_id,
                                  lambda p, i: p.read_file(i, body.path, body.offset, body.limit))
    return page.to_dict()


@router.post("/read_binary", response_model=BinaryOut,
             summary="Read a file's bytes (artifacts), whole (64 MiB at most) or a byte range of any file")
def read_binary(body: ReadBinaryRequest, request: Request, principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, body.tenant_id)
    check_path(body.path, "path")
    data = _runs(request).file_op(tenant, body.session_id, "read_bytes", body.path, principal.token_id,
                                  lambda p, i: p.read_bytes(i, body.path, offset=body.offset, length=body.length))
    offset = getattr(data, "offset", body.offset or 0)
    return {"path": body.path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "content_b64": base64.b64encode(data).decode(), "offset": offset,
            "total_size": getattr(data, "total_size", offset + len(data))}


@router.post("/write", response_model=FileInfoOut, summary="Write a file (content or content_b64)")
def write(body: WriteRequest, request: Request, principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, body.tenant_id)
    check_path(body.path, "path")
    data = _decode(body.content, body.content_b64, "", services(request).settings.max_file_bytes)
    info = _runs(request).file_op(tenant, body.session_id, "write_file", body.path, principal.token_id,
                                  lambda p, i: p.write_file(i, body.path, data, body.mode))
    return info.to_dict()


@router.post("/grep", response_model=GrepOut, summary="Search file contents with a regular expression")
def grep(body: GrepRequest, request: Request, principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, body.tenant_id)
    check_path(body.path, "path")
    check_path(body.glob, "glob")
    found = _runs(request).file_op(tenant, body.session_id, "grep", body.path, principal.token_id,
                                   lambda p, i: p.grep(i, body.pattern, body.path, body.glob, body.max_results))
    return (found if isinstance(found, GrepResult) else GrepResult(found)).to_dict()


@router.post("/glob", response_model=GlobOut, summary="Match workspace paths against a glob pattern")
def glob(body: GlobRequest, request: Request, principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, body.tenant_id)
    check_path(body.pattern, "pattern")
    paths = _runs(request).file_op(tenant, body.session_id, "glob", body.pattern, principal.token_id,
                                   lambda p, i: p.glob(i, body.pattern, body.max_results))
    return (paths if isinstance(paths, GlobResult) else GlobResult(paths)).to_dict()


@router.post("/list", response_model=FilesOut, summary="List a workspace directory")
def list_files(body: ListRequest, request: Request, principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, body.tenant_id)
    check_path(body.path, "path")
    found = _runs(request).file_op(tenant, body.session_id, "list_files", body.path, principal.token_id,
                                   lambda p, i: p.list_files(i, body.path, body.recursive))
    return {"files": [f.to_dict() for f in found]}


# -- who am I, bulk copy (session lifecycle routes: routes/sessions.py) -----------------------------


@router.get("/whoami", response_model=WhoAmI, summary="The tenant and role of the calling token")
def whoami(principal: Principal = Depends(require_token)) -> Any:
    return {"tenant_id": principal.tenant_id, "role": principal.role, "token_id": principal.token_id}


def _name_path() -> Any:
    """A fresh Path() per parameter (FastAPI binds a FieldInfo to one parameter name)."""
    return Path(pattern=NAME_PATTERN, max_length=64)


@router.post("/sessions/{tenant_id}/{session_id}/copy", response_model=FilesOut,
             summary="Write many files into a workspace atomically: all or none")
def copy_files(body: CopyRequest, request: Request, tenant_id: str = _name_path(), session_id: str = _name_path(),
               principal: Principal = Depends(require_token)) -> Any:
    tenant = tenant_for(principal, tenant_id)
    limit = services(request).settings.max_file_bytes
    files: dict[str, str | bytes] = {}
    for i, item in enumerate(body.files):
        check_path(item.path, f"files.{i}.path")
        if item.path in files:
            raise InvalidConfigError(f"files[{i}].path {item.path!r} appears twice",
                                     details={"field": f"files.{i}.path"})
        files[item.path] = _decode(item.content, item.content_b64, f"files.{i}.", limit)
    written = _runs(request).file_op(tenant, session_id, "write_files", ",".join(files), principal.token_id,
                                     lambda p, i: p.write_files(i, files))
    return {"files": [f.to_dict() for f in written]}
