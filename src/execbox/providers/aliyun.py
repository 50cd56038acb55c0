"""Provider ``aliyun_codeinterpreter``: Alibaba Cloud AgentRun code-interpreter sandboxes through
the official ``agentrun-sdk`` (serverless microVMs, 30-second hard execution limit).

Config keys follow the RAGFlow design (access_key_id, access_key_secret, account_id, region,
template_name, timeout) with ``AGENTRUN_*`` environment fallbacks. Every SDK call gets the same
explicit ``Config`` (RAGFlow's provider forgot it on delete). Code runs through a context
``execute`` wrapped by ``remote_code``; artifacts come back through the sandbox file API.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

from ..agent.paths import PathViolation, check_syntax
from ..errors import (
    ConnectionFailedError,
    FileNotFoundInSandbox,
    InstanceCreationError,
    InvalidConfigError,
    PathError,
    ProviderUnavailableError,
    SandboxError,
    SessionNotFoundError,
)
from ..models import (
    Artifact,
    ExecutionResult,
    FileInfo,
    Isolation,
    Language,
    SandboxInstance,
    TextPage,
    make_instance_id,
)
from .aliyun_config import (
    DEFAULT_TEMPLATE,
    HARD_TIMEOUT,
    WORKDIR,
    config_error,
    config_schema,
    with_env_fallbacks,
)
from .base import OutputCallback, SandboxProvider, check_run_inputs
from .remote_code import (
    ARTIFACTS_DIR,
    extract_result,
    is_connect_error,
    make_artifact,
    mask_secrets,
    new_marker,
    text_page,
    wrap_javascript,
    wrap_python,
)
from .schema import check_config

log = logging.getLogger("execbox.provider.aliyun")

class AliyunCodeInterpreterProvider(SandboxProvider):
    name = "aliyun_codeinterpreter"
    display_name = "Aliyun Code Interpreter (AgentRun)"
    description = "Alibaba Cloud AgentRun code-interpreter sandboxes (serverless microVMs) via agentrun-sdk."
    tags = ["cloud", "saas", "microvm", "china"]
    isolation = Isolation.GVISOR  # a serverless microVM per sandbox: at least our strongest tier
    zero_config = False

    def __init__(self) -> None:
        super().__init__()
        self._sdk_config: Any = None
        self._sandbox_ids: dict[str, str] = {}  # instance id -> AgentRun sandbox id
        self._sandboxes: dict[str, Any] = {}  # instance id -> connected sandbox object
        self._template: str | None = None
        self._lock = threading.Lock()

    @staticmethod
    def get_config_schema() -> dict[str, dict[str, Any]]:
        return config_schema()

    @staticmethod
    def with_env_fallbacks(config: Mapping[str, Any], env: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Fill keys missing from ``config`` from their AGENTRUN_* variables."""
        return with_env_fallbacks(config, env)

    def validate_config(self, config: dict[str, Any]) -> tuple[bool, str | None]:
        return config_error(config)

    def initialize(self, config: dict[str, Any]) -> bool:
        clean = check_config(self.get_config_schema(), self.with_env_fallbacks(config or {}), self.name)
        ok, message = self.validate_config(clean)
        if not ok:
            raise InvalidConfigError(f"invalid {self.name} configuration: {message}",
                                     details={"provider": self.name})
        try:
            from agentrun.utils.config import Config
        except ImportError as e:  # pragma: no cover - the dependency is declared
            raise ProviderUnavailableError("aliyun_codeinterpreter needs agentrun-sdk (pip install agentrun-sdk)",
                                           details={"missing": "agentrun"}) from e
        self.config = clean
        self._sdk_config = Config(
            access_key_id=clean["access_key_id"], access_key_secret=clean["access_key_secret"],
            account_id=clean["account_id"], region_id=clean["region"], timeout=HARD_TIMEOUT + 30,
            control_endpoint=clean.get("control_endpoint") or None, data_endpoint=clean.get("data_endpoint") or None,
        )
        self._template = None
        self.initialized = True
        return True

    # -- errors ---------------------------------------------------------------------------------
    def _map_error(self, err: Exception, action: str) -> SandboxError:
        from agentrun.utils.exception import ClientError, ResourceNotExistError, ServerError

        text = mask_secrets(str(err), [self.config.get("access_key_secret"), self.config.get("access_key_id")])
        details = {"provider": self.name, "action": action, "sdk_error": type(err).__name__}
        status = getattr(err, "status_code", None)
        if is_connect_error(err):
            return ConnectionFailedError(f"agentrun is not reachable while trying to {action}: {text}",
                                         details=details)
        if isinstance(err, ResourceNotExistError) or status == 404:
            return FileNotFoundInSandbox(f"agentrun: not found while trying to {action}: {text}", details=details)
        if status in (401, 403):
            return ConnectionFailedError(f"agentrun refused the credentials while trying to {action} "
                                         f"(HTTP {status}); check the RAM user's AccessKey and policy",
                                         details=details)
        if action in ("create a sandbox", "get or create the template"):
            return InstanceCreationError(f"agentrun could not {action}: {text}", details=details)
        if isinstance(err, (ClientError, ServerError)) and status == 0:
            return ProviderUnavailableError(f"agentrun is unreachable while trying to {action}: {text}",
                                            details=details)
        return ProviderUnavailableError(f"agentrun failed to {action}: {text}", details=details)

    # -- template and lifecycle ------------------------------------------------------------------
    def template_name(self) -> str:
        """The configured template, or execbox's own one, created on first use (get-or-create)."""
        if self.config.get("template_name"):
            return self.config["template_name"]
        if self._template:
            return self._template
        from agentrun.sandbox import Sandbox, TemplateInput, TemplateType
        from agentrun.utils.exception import ResourceNotExistError

        try:
            try:
                Sandbox.get_template(DEFAULT_TEMPLATE, config=self._sdk_config)
            except ResourceNotExistError:
                log.info("agentrun: creating template %s", DEFAULT_TEMPLATE)
                Sandbox.create_template(TemplateInput(template_name=DEFAULT_TEMPLATE,
                                                      template_type=TemplateType.CODE_INTERPRETER),
                                        config=self._sdk_config)
        except SandboxError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._map_error(e, "get or create the template") from e
        self._template = DEFAULT_TEMPLATE
        return DEFAULT_TEMPLATE

    def create_instance(self, template: str = "python", *, tenant_id: str = "default",
                        session_id: str | None = None) -> SandboxInstance:
        self._require_initialized()
        from agentrun.sandbox import Sandbox, TemplateType

        name = self.template_name()
        instance_id = make_instance_id(tenant_id, session_id)
        try:
            sandbox = Sandbox.create(template_type=TemplateType.CODE_INTERPRETER, template_name=name,
                                     sandbox_idle_timeout_seconds=max(300, HARD_TIMEOUT * 10),
                                     config=self._sdk_config)
        except Exception as e:  # noqa: BLE001
            raise self._map_error(e, "create a sandbox") from e
        with self._lock:
            self._sandbox_ids[instance_id] = sandbox.sandbox_id
            self._sandboxes[instance_id] = sandbox
        return SandboxInstance(instance_id, self.name, "running", {
            "tenant_id": tenant_id, "session_id": session_id, "sandbox_id": sandbox.sandbox_id,
            "template_name": name, "region": self.config["region"], "isolation": self.isolation.value,
            "isolation_detail": "serverless-microvm (agentrun)"})

    def _sandbox(self, instance_id: str) -> Any:
        """The sandbox object, reconnected by id (config passed) when it is not cached."""
        self._require_initialized()
        sandbox_id = self._sandbox_ids.get(instance_id)
        if sandbox_id is None:
            raise SessionNotFoundError(f"no instance {instance_id!r} in provider {self.name!r}",
                                       details={"instance_id": instance_id})
        sandbox = self._sandboxes.get(instance_id)
        if sandbox is None:
            from agentrun.sandbox import Sandbox, TemplateType

            try:
                sandbox = Sandbox.connect(sandbox_id, template_type=TemplateType.CODE_INTERPRETER,
                                          config=self._sdk_config)
            except Exception as e:  # noqa: BLE001
                raise self._map_error(e, "connect to the sandbox") from e
            self._sandboxes[instance_id] = sandbox
        return sandbox

    def forget_connection(self, instance_id: str) -> None:
        """Drop the cached sandbox object (the next call reconnects by id)."""
        self._sandboxes.pop(instance_id, None)

    def destroy_instance(self, instance_id: str) -> bool:
        with self._lock:
            sandbox_id = self._sandbox_ids.pop(instance_id, None)
            self._sandboxes.pop(instance_id, None)
        if sandbox_id is None:
            return False
        from agentrun.sandbox import Sandbox
        from agentrun.utils.exception import ResourceNotExistError

        try:
            Sandbox.delete_by_id(sandbox_id, config=self._sdk_config)
        except ResourceNotExistError:
            pass
        except Exception as e:  # noqa: BLE001 - the idle timeout reclaims it anyway
            log.warning("agentrun: deleting sandbox %s failed: %s", sandbox_id, type(e).__name__)
        return True

    def health_check(self) -> bool:
        """Credentials and control plane work: the template lookup answers (found or not found)."""
        if not self.initialized:
            return False
        from agentrun.sandbox import Sandbox
        from agentrun.utils.exception import ResourceNotExistError

        try:
            Sandbox.get_template(self.config.get("template_name") or DEFAULT_TEMPLATE, config=self._sdk_config)
        except ResourceNotExistError:
            return True
        except Exception as e:  # noqa: BLE001
            log.info("agentrun health check failed: %s", type(e).__name__)
            return False
        return True

    def get_supported_languages(self) -> list[str]:
        return ["python", "javascript"]

    def shutdown(self) -> None:
        for instance_id in list(self._sandbox_ids):
            self.destroy_instance(instance_id)
        self.initialized = False

    # -- execution ------------------------------------------------------------------------------
    def execute_code(self, instance_id: str, code: str, language: str, timeout: int = 10,
                     arguments: dict[str, Any] | None = None, *, context_id: str | None = None,
                     on_output: OutputCallback | None = None,
                     inline_artifacts: bool = False) -> ExecutionResult:
        lang = Language.parse(language)
        if lang is Language.BASH:
            raise InvalidConfigError("language 'bash' is not supported by aliyun_codeinterpreter "
                                     "(python and javascript only)", details={"field": "language"},
                                     http_status=501)
        if context_id is not None:
            raise self._unsupported("stateful contexts (context_id)")
        check_run_inputs(code, arguments, timeout)
        if timeout > HARD_TIMEOUT:
            raise InvalidConfigError(f"timeout {timeout:g}s exceeds aliyun_codeinterpreter's hard limit of "
                                     f"{HARD_TIMEOUT}s", details={"field": "timeout", "max": HARD_TIMEOUT})
        sandbox = self._sandbox(instance_id)
        marker = new_marker()
        wrapped = (wrap_python if lang is Language.PYTHON else wrap_javascript)(code, arguments, marker)
        started = time.monotonic()
        try:
            raw = sandbox.context.execute(code=wrapped, language=lang.value, timeout=max(1, int(round(timeout))))
        except Exception as e:  # noqa: BLE001
            if "timeout" in str(e).lower() or "timed out" in str(e).lower():
                return self._timed_out(instance_id, lang, time.monotonic() - started, timeout)
            raise self._map_error(e, "run code") from e
        result = self._to_result(sandbox, instance_id, lang, raw, marker, time.monotonic() - started, timeout)
        if on_output is not None:  # the service answers once: deliver output at the end
            if result.stdout:
                on_output("stdout", result.stdout)
            if result.stderr:
                on_output("stderr", result.stderr)
        return result

    def _metadata(self, instance_id: str, lang: Language) -> dict[str, Any]:
        return {"provider": self.name, "isolation": self.isolation.value,
                "isolation_detail": "serverless-microvm (agentrun)", "instance_id": instance_id,
                "language": lang.value, "peak_memory_kb": None}

    def _timed_out(self, instance_id: str, lang: Language, wall: float, timeout: float) -> ExecutionResult:
        metadata = self._metadata(instance_id, lang)
        metadata.update(error_code="SB005", error_message=f"execution timed out after {timeout:g}s",
                        result_present=False, result_type=None)
        return ExecutionResult(stdout="", stderr="", exit_code=-1, execution_time=wall, metadata=metadata,
                               timed_out=True)

    def _to_result(self, sandbox: Any, instance_id: str, lang: Language, raw: Any, marker: str, wall: float,
                   timeout: float) -> ExecutionResult:
        items = raw.get("results") if isinstance(raw, dict) else None
        if not isinstance(items, list):
            raise ProviderUnavailableError("agentrun answered an execute call without a results list",
                                           details={"provider": self.name})
        out, err, errors, status = [], [], [], "ok"
        for item in items:
            kind = item.get("type")
            if kind == "stdout":
                out.append(str(item.get("text", "")))
            elif kind == "stderr":
                err.append(str(item.get("text", "")))
            elif kind == "error":
                errors.append(item)
            elif kind == "endOfExecution":
                status = str(item.get("status") or "ok")
        stdout, payload = extract_result(_join(out), marker)
        stderr = _join(err)
        for e in errors:
            trace = e.get("traceback") or e.get("text") or f"{e.get('name', 'Error')}: {e.get('value', '')}"
            if isinstance(trace, list):
                trace = "\n".join(map(str, trace))
            stderr += ("" if not stderr or stderr.endswith("\n") else "\n") + str(trace)
        if stderr and not stderr.endswith("\n"):
            stderr += "\n"
        if status.lower() in ("timeout", "timedout", "timed_out"):
            res = self._timed_out(instance_id, lang, wall, timeout)
            res.stdout, res.stderr = stdout, stderr
            return res
        exit_code = 1 if errors or status.lower() not in ("ok", "success") else 0
        present = bool(payload and payload.get("present"))
        metadata = self._metadata(instance_id, lang)
        metadata.update(result_present=present, result_type=payload.get("type") if present else None,
                        context_id=raw.get("contextId"), remote_status=status)
        artifacts = self._artifacts(sandbox, (payload or {}).get("artifacts") or [])
        return ExecutionResult(stdout=stdout, stderr=stderr, exit_code=exit_code, execution_time=wall,
                               metadata=metadata, result=payload.get("value") if present else None,
                               artifacts=artifacts)

    def _artifacts(self, sandbox: Any, names: list[str]) -> list[Artifact]:
        out = []
        for name in names[:50]:
            try:
                check_syntax(name)
                data = self._download(sandbox, f"{WORKDIR}/{ARTIFACTS_DIR}/{name}")
            except Exception as e:  # noqa: BLE001 - one unreadable file must not lose the run
                log.warning("agentrun: artifact %r could not be read: %s", name, type(e).__name__)
                continue
            out.append(make_artifact(name, data))
        return out

    # -- files ----------------------------------------------------------------------------------
    @staticmethod
    def _abs(path: str) -> str:
        try:
            rel = check_syntax(path)
        except PathViolation as e:
            raise PathError(str(e), details={"path": e.path, "reason": e.reason}) from None
        return WORKDIR if rel == "." else f"{WORKDIR}/{rel}"

    @staticmethod
    def _download(sandbox: Any, remote: str) -> bytes:
        with tempfile.TemporaryDirectory(prefix="execbox-agentrun-") as tmp:
            local = os.path.join(tmp, "download")
            sandbox.file_system.download(remote, local)
            with open(local, "rb") as f:
                return f.read()

    def read_bytes(self, instance_id: str, path: str) -> bytes:
        target = self._abs(path)
        sandbox = self._sandbox(instance_id)
        try:
            return self._download(sandbox, target)
        except Exception as e:  # noqa: BLE001
            raise self._map_error(e, f"read {path}") from e

    def read_file(self, instance_id: str, path: str, offset: int = 0, limit: int = 2000) -> TextPage:
        return text_page(path, self.read_bytes(instance_id, path), offset, limit)

    def write_file(self, instance_id: str, path: str, content: str | bytes, mode: str = "overwrite") -> FileInfo:
        target = self._abs(path)
        if mode != "overwrite":
            raise InvalidConfigError("aliyun_codeinterpreter supports mode 'overwrite' only",
                                     details={"field": "mode"}, http_status=501)
        data = content.encode() if isinstance(content, str) else content
        if not isinstance(data, bytes):
            raise InvalidConfigError("content must be str or bytes", details={"field": "content"})
        sandbox = self._sandbox(instance_id)
        try:
            with tempfile.TemporaryDirectory(prefix="execbox-agentrun-") as tmp:
                local = os.path.join(tmp, "upload")
                with open(local, "wb") as f:
                    f.write(data)
                sandbox.file_system.upload(local, target)
        except Exception as e:  # noqa: BLE001
            raise self._map_error(e, f"write {path}") from e
        return FileInfo(path=check_syntax(path), size=len(data), is_dir=False, modified=time.time())


def _join(chunks: list[str]) -> str:
    """Output items are lines (joined with newlines, as RAGFlow's client does) or raw chunks."""
    if all(c.endswith("\n") for c in chunks):
        return "".join(chunks)
    return "\n".join(c[:-1] if c.endswith("\n") else c for c in chunks) + ("\n" if chunks else "")
