"""Provider ``self_managed``: an HTTP client for an executor ``/run`` API (execbox's own, served by
``execbox executor`` or ``execbox serve``, or RAGFlow's executor_manager).

Not agent-backed: the remote side owns boxes, so this provider only speaks the wire shape. With
``api: execbox`` the remote is an execbox service and its own sandbox API is used instead
(sessions, files, bash, contexts; providers/self_managed_native.py).
Retries happen on connect errors only (the request never reached the server, so no code can
have started); a connection lost after the request was sent is reported, never re-sent.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
import time
from typing import Any

import httpx

from ..errors import (
    CodeBlockedError,
    ConnectionFailedError,
    ExecutionTimeoutError,
    InstanceCreationError,
    InvalidConfigError,
    ProviderUnavailableError,
    SandboxError,
    SessionNotFoundError,
    error_from_dict,
)
from ..models import Artifact, ExecutionResult, Isolation, Language, SandboxInstance, make_instance_id
from ..policy import AstPolicy
from .base import OutputCallback, SandboxProvider, check_run_inputs
from .schema import check_config, url_problem
from .self_managed_native import API_EXECBOX, API_RUN, ExecboxApiMixin

log = logging.getLogger("execbox.provider.self_managed")

# -- the executor /run wire shape (RAGFlow executor_manager's, shared with routes.executor_compat) --
STATUSES = ("success", "program_error", "resource_limit_exceeded", "unauthorized_access", "runtime_error",
            "program_runner_error")
RESOURCE_LIMIT_TYPES = ("time", "memory", "output")
UNAUTHORIZED_ACCESS_TYPES = ("disallowed_syscall", "file_access", "network_access")
RUNTIME_ERROR_TYPES = ("signalled", "nonzero_exit")
WIRE_LANGUAGES = {Language.PYTHON: "python", Language.JAVASCRIPT: "nodejs"}

HTTP_GRACE = 15.0  # seconds past the execution timeout before the client gives up on a response
BACKOFF_BASE = 0.25
BACKOFF_MAX = 4.0


def _sb_for_runner_error(body: dict[str, Any], http_status: int) -> SandboxError:
    """A ``program_runner_error`` (the runner failed, not the program) as a typed SB error."""
    if isinstance(body.get("error"), dict):  # execbox's executor adds its SB error
        return error_from_dict(body, http_status if http_status >= 400 else None)
    detail = str(body.get("detail") or "")
    stderr = str(body.get("stderr") or "")
    message = f"remote executor: {detail or 'runner error'}" + (f": {stderr[:500]}" if stderr else "")
    details = {"status": body.get("status"), "detail": detail, "exit_code": body.get("exit_code")}
    if detail == "Code is unsafe":  # RAGFlow's AST filter
        return CodeBlockedError(message, details=details)
    if detail == "no_available_container" or "pool is busy" in stderr.lower():
        return InstanceCreationError(message, details=details)
    return ProviderUnavailableError(message, details=details)


def run_response_to_result(body: dict[str, Any], *, provider: str, instance_id: str, wall: float,
                           default_isolation: str, http_status: int = 200) -> ExecutionResult:
    """Map a ``/run`` response to an ExecutionResult (raising for runner errors)."""
    status = body.get("status")
    if status not in STATUSES:
        raise ProviderUnavailableError(
            f"remote executor answered HTTP {http_status} without a known /run status",
            details={"http_status": http_status, "status": status})
    if status == "program_runner_error":
        raise _sb_for_runner_error(body, http_status)
    limit = body.get("resource_limit_type")
    metadata: dict[str, Any] = {
        "provider": provider,
        "isolation": body.get("isolation") or default_isolation,
        "instance_id": instance_id,
        "remote_status": status,
        "detail": body.get("detail"),
        "time_used_ms": body.get("time_used_ms"),
        "peak_memory_kb": body.get("memory_used_kb"),
        "host_overhead_ms": round(wall * 1000 - float(body.get("time_used_ms") or 0.0), 3),
    }
    for key in ("resource_limit_type", "unauthorized_access_type", "runtime_error_type"):
        if body.get(key):
            metadata[key] = body[key]
    timed_out = status == "resource_limit_exceeded" and limit == "time"
    if timed_out:
        metadata["error_code"] = "SB005"
        metadata["error_message"] = body.get("detail") or "execution timed out"
    elif status == "resource_limit_exceeded" and limit == "memory":
        metadata["error_code"] = "SB006"
        metadata["error_message"] = body.get("detail") or "execution ran out of memory"
    elif status == "unauthorized_access":
        metadata["error_code"] = "SB007"
        denied = body.get("unauthorized_access_type") or "an operation"
        metadata["error_message"] = f"the sandbox denied {denied}"
    res = body.get("result") or {}
    present = bool(res.get("present"))
    metadata["result_present"] = present
    metadata["result_type"] = res.get("type") if present else None
    artifacts = []
    for a in body.get("artifacts") or []:
        data = base64.b64decode(a.get("content_b64") or "")
        artifacts.append(Artifact(name=a["name"], mime_type=a.get("mime_type") or "application/octet-stream",
                                  size=int(a.get("size", len(data))), sha256=hashlib.sha256(data).hexdigest(),
                                  path=a["name"], _data=data))
    exit_code = body.get("exit_code")
    return ExecutionResult(
        stdout=str(body.get("stdout") or ""), stderr=str(body.get("stderr") or ""),
        exit_code=int(exit_code) if exit_code is not None else (0 if status == "success" else 1),
        execution_time=float(body.get("time_used_ms") or wall * 1000) / 1000.0,
        metadata=metadata, timed_out=timed_out,
        truncated=status == "resource_limit_exceeded" and limit == "output",
        result=res.get("value") if present else None, artifacts=artifacts,
    )


class SelfManagedProvider(ExecboxApiMixin, SandboxProvider):
    name = "self_managed"
    display_name = "Remote executor (/run)"
    description = ("Sends code to an executor /run endpoint: another execbox (`execbox executor`) "
                   "or RAGFlow's executor_manager.")
    tags = ["remote", "ragflow-compatible"]
    # RAGFlow's executor runs Docker containers (gVisor recommended, not verifiable from here);
    # per-result metadata reports what the remote says when it says it (execbox does).
    isolation = Isolation.CONTAINER
    zero_config = False

    def __init__(self) -> None:
        super().__init__()
        self._client: httpx.Client | None = None
        self._instances: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._policy: AstPolicy | None = None
        self._native_init()

    @staticmethod
    def get_config_schema() -> dict[str, dict[str, Any]]:
        return {
            "endpoint": {"type": "string", "required": True, "default": "http://localhost:9385",
                         "secret_destination": True,
                         "label": "API Endpoint", "placeholder": "http://localhost:9385",
                         "description": "Base URL of the executor (serves /run and /healthz)."},
            "api": {"type": "string", "default": API_RUN, "options": [API_RUN, API_EXECBOX], "label": "API",
                    "description": "'run': the executor /run API (RAGFlow's contract: python and nodejs, "
                                   "no sessions). 'execbox': the endpoint is an execbox service; use its "
                                   "sandbox API (sessions, files, bash, contexts, execbox's own semantics)."},
            "timeout": {"type": "integer", "default": 30, "min": 1, "max": 3600,
                        "label": "Execution Timeout (seconds)",
                        "description": "Default execution timeout; the HTTP wait adds a grace period."},
            "max_retries": {"type": "integer", "default": 3, "min": 0, "max": 10, "label": "Max retries",
                            "description": "Retries with exponential backoff on connect errors only; a "
                                           "request that reached the server is never re-sent."},
            "pool_size": {"type": "integer", "default": 10, "min": 1, "max": 100,
                          "label": "Container Pool Size",
                          "description": "Informational: the remote executor's pool size (also caps this "
                                         "client's open connections)."},
            "api_key": {"type": "string", "secret": True, "label": "Bearer token",
                        "description": "Token sent as 'Authorization: Bearer'; needed when the executor is "
                                       "not on loopback."},
            "max_memory": {"type": "string", "default": "256m", "label": "Max Memory per Container",
                           "options": ["128m", "256m", "512m", "1g"],
                           "description": "Informational: enforced by the remote executor's own settings."},
            "enable_seccomp": {"type": "boolean", "default": True, "label": "Seccomp",
                               "description": "Informational: enforced by the remote executor."},
            "enable_ast_analysis": {"type": "boolean", "default": False, "label": "AST policy",
                                    "description": "Lint Python code here before sending it (SB007). "
                                                   "A guard rail, not the security boundary."},
        }

    def validate_config(self, config: dict[str, Any]) -> tuple[bool, str | None]:
        # the endpoint is shown in the config, in errors and in the retry log: a password in it
        # would be everywhere a secret must not be (api_key is stored encrypted and redacted)
        problem = url_problem("endpoint", config.get("endpoint", ""), secret_field="api_key")
        return (False, problem) if problem else (True, None)

    def initialize(self, config: dict[str, Any]) -> bool:
        clean = check_config(self.get_config_schema(), config or {}, self.name)
        ok, message = self.validate_config(clean)
        if not ok:
            raise InvalidConfigError(f"invalid {self.name} configuration: {message}",
                                     details={"provider": self.name, "field": "endpoint"})
        if self._client is not None:
            self._client.close()
        self.config = clean
        headers = {"User-Agent": "execbox-self-managed"}
        if clean.get("api_key"):
            headers["Authorization"] = f"Bearer {clean['api_key']}"
        # keep-alive shorter than servers' idle close (uvicorn: 5 s), so a pooled connection is
        # not found closed after the request was written (that would look like a lost request)
        limits = httpx.Limits(max_connections=int(clean["pool_size"]), max_keepalive_connections=4,
                              keepalive_expiry=2.0)
        self._client = httpx.Client(base_url=clean["endpoint"].rstrip("/"), headers=headers, limits=limits,
                                    transport=httpx.HTTPTransport(retries=0))
        self._policy = AstPolicy.from_config(None, None) if clean.get("enable_ast_analysis") else None
        self.initialized = True
        return True

    # -- instances are logical: the remote executor allocates a box per /run --------------------
    def create_instance(self, template: str = "python", *, tenant_id: str = "default",
                        session_id: str | None = None) -> SandboxInstance:
        self._require_initialized()
        instance_id = make_instance_id(tenant_id, session_id)
        meta = {"tenant_id": tenant_id, "session_id": session_id, "endpoint": self.config["endpoint"],
                "pool_size": self.config["pool_size"], "isolation": self.isolation.value}
        if self.native:
            meta.update(self._native_create(instance_id))
        with self._lock:
            self._instances[instance_id] = meta
        return SandboxInstance(instance_id, self.name, "running", dict(meta))

    def destroy_instance(self, instance_id: str) -> bool:
        self._native_destroy(instance_id)
        with self._lock:
            return self._instances.pop(instance_id, None) is not None

    def get_supported_languages(self) -> list[str]:
        return [lang.value for lang in Language] if self.native else ["python", "javascript"]

    def health_check(self) -> bool:
        if self._client is None:
            return False
        try:
            r = self._client.get("/healthz", timeout=5.0)
            return r.status_code == 200 and r.json().get("status") == "ok"
        except (httpx.HTTPError, ValueError, AttributeError):
            return False

    def shutdown(self) -> None:
        for instance_id in list(self._sessions):
            self._native_destroy(instance_id)
        if self._client is not None:
            self._client.close()
            self._client = None
        with self._lock:
            self._instances.clear()
        self.initialized = False

    # -- execution ------------------------------------------------------------------------------
    def execute_code(self, instance_id: str, code: str, language: str, timeout: int = 10,
                     arguments: dict[str, Any] | None = None, *, context_id: str | None = None,
                     on_output: OutputCallback | None = None,
                     inline_artifacts: bool = False) -> ExecutionResult:
        self._require_initialized()
        if instance_id not in self._instances:
            raise SessionNotFoundError(f"no instance {instance_id!r} in provider {self.name!r}",
                                       details={"instance_id": instance_id})
        lang = Language.parse(language)
        if self.native:
            check_run_inputs(code, arguments, timeout)
            if lang is Language.PYTHON and self._policy is not None:
                self._policy.check(code)
            return self._native_execute(instance_id, code, lang.value, float(timeout), arguments, context_id,
                                        on_output)
        if lang not in WIRE_LANGUAGES:
            raise InvalidConfigError(f"language {lang.value!r} is not supported by self_managed "
                                     "(the /run API runs python and nodejs)",
                                     details={"field": "language", "value": lang.value}, http_status=501)
        if context_id is not None:
            raise self._unsupported("stateful contexts (context_id)")
        check_run_inputs(code, arguments, timeout)
        if lang is Language.PYTHON and self._policy is not None:
            self._policy.check(code)
        payload = {"code_b64": base64.b64encode(code.encode("utf-8")).decode("ascii"),
                   "language": WIRE_LANGUAGES[lang], "arguments": arguments or {}, "timeout": timeout}
        started = time.monotonic()
        response = self._post_run(payload, float(timeout))
        wall = time.monotonic() - started
        try:
            body = response.json()
        except ValueError:
            raise ProviderUnavailableError(
                f"remote executor answered HTTP {response.status_code} with a non-JSON body",
                details={"http_status": response.status_code, "endpoint": self.config["endpoint"]}) from None
        if not isinstance(body, dict):
            raise ProviderUnavailableError("remote executor answered with a non-object JSON body",
                                           details={"http_status": response.status_code})
        if "status" not in body:
            if isinstance(body.get("error"), dict):
                raise error_from_dict(body, response.status_code)
            raise self._http_error(response, body)
        result = run_response_to_result(body, provider=self.name, instance_id=instance_id, wall=wall,
                                        default_isolation=self.isolation.value,
                                        http_status=response.status_code)
        if on_output is not None:  # no streaming over /run: deliver the output once, at the end
            if result.stdout:
                on_output("stdout", result.stdout)
            if result.stderr:
                on_output("stderr", result.stderr)
        return result

    def _http_error(self, response: httpx.Response, body: dict[str, Any]) -> SandboxError:
        status = response.status_code
        details = {"http_status": status, "endpoint": self.config["endpoint"]}
        if status in (401, 403):
            return ConnectionFailedError(
                f"remote executor refused the request (HTTP {status}): check self_managed.api_key",
                details=details)
        if status == 422:
            return InvalidConfigError(f"remote executor rejected the request: {body.get('detail')}",
                                      details={**details, "detail": body.get("detail")})
        return ProviderUnavailableError(f"remote executor answered HTTP {status}", details=details)

    def _post_run(self, payload: dict[str, Any], timeout: float) -> httpx.Response:
        """POST /run, retrying only when the connection could not be made."""
        assert self._client is not None
        retries = int(self.config["max_retries"])
        wait = timeout + HTTP_GRACE
        http_timeout = httpx.Timeout(connect=5.0, read=wait, write=30.0, pool=wait)
        attempt = 0
        while True:
            try:
                request = self._client.build_request("POST", "/run", json=payload, timeout=http_timeout)
                return self._client.send(request)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                # Nothing reached the server: safe to try again.
                if attempt >= retries:
                    raise ConnectionFailedError(
                        f"could not connect to the executor at {self.config['endpoint']} after "
                        f"{attempt + 1} attempt(s): {type(e).__name__}",
                        details={"endpoint": self.config["endpoint"], "attempts": attempt + 1}) from e
                delay = min(BACKOFF_MAX, BACKOFF_BASE * (2 ** attempt))
                log.info("executor %s not reachable (%s); retry %d/%d in %.2fs", self.config["endpoint"],
                         type(e).__name__, attempt + 1, retries, delay)
                time.sleep(delay)
                attempt += 1
            except httpx.ReadTimeout as e:
                raise ExecutionTimeoutError(
                    f"the executor did not answer within {timeout + HTTP_GRACE:.0f}s "
                    f"(timeout {timeout:g}s + {HTTP_GRACE:g}s grace); not retried",
                    details={"endpoint": self.config["endpoint"], "timeout": timeout}) from e
            except httpx.TransportError as e:
                # The request may have reached the server and started running: never re-send it.
                raise ProviderUnavailableError(
                    f"the connection to the executor was lost after the request was sent "
                    f"({type(e).__name__}); the code may have run, so it was not retried",
                    details={"endpoint": self.config["endpoint"], "retried": False}) from e
