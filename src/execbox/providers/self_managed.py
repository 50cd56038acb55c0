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
import json
import logging
import threading
import time
from typing import Any

import httpx

from ..errors import (
    ConnectionFailedError,
    ExecutionTimeoutError,
    InvalidConfigError,
    ProviderUnavailableError,
    SandboxError,
    SessionNotFoundError,
)
from ..models import ExecutionResult, Isolation, Language, SandboxInstance, make_instance_id
from ..policy import AstPolicy
from ..redaction import scrub
from ..sdk.bounded import MAX_RESPONSE_BYTES, clamp_transport, deadline, read_body
from ..sdk.wire import typed_error
from .base import OutputCallback, SandboxProvider, check_run_inputs
from .schema import check_config, url_problem
from .self_managed_native import API_EXECBOX, API_RUN, ExecboxApiMixin, relayed_error
from .self_managed_wire import (  # noqa: F401 - the /run wire shape, re-exported for its users
    RESOURCE_LIMIT_TYPES,
    RUNTIME_ERROR_TYPES,
    STATUSES,
    UNAUTHORIZED_ACCESS_TYPES,
    WIRE_LANGUAGES,
    run_response_to_result,
)

log = logging.getLogger("execbox.provider.self_managed")

HTTP_GRACE = 15.0  # seconds past the execution timeout before the client gives up on a response
BACKOFF_BASE = 0.25
BACKOFF_MAX = 4.0
HEALTH_BODY_LIMIT = 64 * 1024
REMOTE = "the remote executor"
"""How errors name the executor: its endpoint is the operator's internal address, shown to tenants
nowhere (it is logged, for the operator)."""


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
        # the endpoint is shown in the config and the server log (never in tenants' errors): a
        # password in it would be where a secret must not be (api_key is stored encrypted, redacted)
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
        # every socket read obeys the exchange's wall-clock deadline (sdk/bounded.py)
        # (limits go to the transport: httpx ignores a client's limits when a transport is given)
        self._client = httpx.Client(base_url=clean["endpoint"].rstrip("/"), headers=headers,
                                    transport=clamp_transport(httpx.HTTPTransport(retries=0, limits=limits)))
        self._policy = AstPolicy.from_config(None, None) if clean.get("enable_ast_analysis") else None
        self.initialized = True
        return True

    # -- instances are logical: the remote executor allocates a box per /run --------------------
    def create_instance(self, template: str = "python", *, tenant_id: str = "default",
                        session_id: str | None = None) -> SandboxInstance:
        self._require_initialized()
        instance_id = make_instance_id(tenant_id, session_id)
        meta = {"tenant_id": tenant_id, "session_id": session_id,
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
            with deadline(5.0) as dl, self._client.stream("GET", "/healthz", timeout=5.0) as r:
                body = json.loads(read_body(r, HEALTH_BODY_LIMIT, dl, "the /healthz answer"))
            return r.status_code == 200 and isinstance(body, dict) and body.get("status") == "ok"
        except (httpx.HTTPError, ValueError, SandboxError):
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
            self.check_code_policy(code, lang)
            return self._native_execute(instance_id, code, lang.value, float(timeout), arguments, context_id,
                                        on_output)
        if lang not in WIRE_LANGUAGES:
            raise InvalidConfigError(f"language {lang.value!r} is not supported by self_managed "
                                     "(the /run API runs python and nodejs)",
                                     details={"field": "language", "value": lang.value}, http_status=501)
        if context_id is not None:
            raise self._unsupported("stateful contexts (context_id)")
        check_run_inputs(code, arguments, timeout)
        self.check_code_policy(code, lang)
        payload = {"code_b64": base64.b64encode(code.encode("utf-8")).decode("ascii"),
                   "language": WIRE_LANGUAGES[lang], "arguments": arguments or {}, "timeout": timeout}
        started = time.monotonic()
        status, content = self._post_run(payload, float(timeout))
        wall = time.monotonic() - started
        body = self._run_body(status, content)
        if "status" not in body:
            if isinstance(body.get("error"), dict) and status not in (401, 403):  # those: no body relayed
                raise relayed_error(typed_error(body["error"], status), self.config.get("api_key"))
            raise self._http_error(status, body)
        result = run_response_to_result(body, provider=self.name, instance_id=instance_id, wall=wall,
                                        default_isolation=self.isolation.value, http_status=status)
        if on_output is not None:  # no streaming over /run: deliver the output once, at the end
            if result.stdout:
                on_output("stdout", result.stdout)
            if result.stderr:
                on_output("stderr", result.stderr)
        return result

    def _run_body(self, status: int, content: bytes) -> dict[str, Any]:
        if 300 <= status < 400:
            log.warning("executor %s answered /run with a redirect (HTTP %d); not followed",
                        self.config["endpoint"], status)
            raise ProviderUnavailableError(f"{REMOTE} answered HTTP {status} redirect, not followed",
                                           details={"http_status": status})
        try:
            body = json.loads(content)
        except ValueError:
            raise ProviderUnavailableError(f"{REMOTE} answered HTTP {status} with a non-JSON body",
                                           details={"http_status": status}) from None
        if not isinstance(body, dict):
            raise ProviderUnavailableError(f"{REMOTE} answered with a non-object JSON body",
                                           details={"http_status": status})
        return body

    def _http_error(self, status: int, body: dict[str, Any]) -> SandboxError:
        details: dict[str, Any] = {"http_status": status}
        if status in (401, 403):
            return ConnectionFailedError(
                f"{REMOTE} refused the request (HTTP {status}): check self_managed.api_key", details=details)
        if status == 422:
            detail = scrub(str(body.get("detail")), [self.config.get("api_key")])[:500]
            return InvalidConfigError(f"{REMOTE} rejected the request: {detail}", details={**details, "detail": detail})
        return ProviderUnavailableError(f"{REMOTE} answered HTTP {status}", details=details)

    def _post_run(self, payload: dict[str, Any], timeout: float) -> tuple[int, bytes]:
        """POST /run and read the answer (at most MAX_RESPONSE_BYTES, by timeout + HTTP_GRACE of
        wall-clock time), retrying only when the connection could not be made."""
        assert self._client is not None
        endpoint = self.config["endpoint"]
        retries = int(self.config["max_retries"])
        wait = timeout + HTTP_GRACE
        http_timeout = httpx.Timeout(connect=5.0, read=wait, write=30.0, pool=wait)
        late = (f"{REMOTE} did not answer within {wait:g}s (timeout {timeout:g}s + {HTTP_GRACE:g}s grace); "
                "not retried")
        attempt = 0
        while True:
            try:
                with deadline(wait, ExecutionTimeoutError, late) as dl:
                    try:
                        request = self._client.build_request("POST", "/run", json=payload, timeout=http_timeout)
                        response = self._client.send(request, stream=True)
                        try:
                            return response.status_code, read_body(response, MAX_RESPONSE_BYTES, dl,
                                                                   f"{REMOTE}'s answer", ProviderUnavailableError)
                        finally:
                            response.close()
                    except httpx.TimeoutException as e:
                        if dl.expired or isinstance(e, httpx.ReadTimeout):
                            raise dl.failure() from e
                        raise
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                # Nothing reached the server: safe to try again.
                if attempt >= retries:
                    log.warning("executor %s not reachable after %d attempt(s): %s", endpoint, attempt + 1,
                                type(e).__name__)
                    raise ConnectionFailedError(
                        f"could not connect to {REMOTE} after {attempt + 1} attempt(s): {type(e).__name__}",
                        details={"attempts": attempt + 1}) from e
                delay = min(BACKOFF_MAX, BACKOFF_BASE * (2 ** attempt))
                log.info("executor %s not reachable (%s); retry %d/%d in %.2fs", endpoint,
                         type(e).__name__, attempt + 1, retries, delay)
                time.sleep(delay)
                attempt += 1
            except ExecutionTimeoutError:
                log.warning("executor %s gave no complete /run answer within %.0fs", endpoint, wait)
                raise
            except httpx.TransportError as e:
                # The request may have reached the server and started running: never re-send it.
                log.warning("executor %s: connection lost after the /run request was sent (%s)", endpoint,
                            type(e).__name__)
                raise ProviderUnavailableError(
                    f"the connection to {REMOTE} was lost after the request was sent "
                    f"({type(e).__name__}); the code may have run, so it was not retried",
                    details={"retried": False}) from e
