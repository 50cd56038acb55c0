"""Provider ``e2b``: E2B cloud sandboxes (Firecracker microVMs) through the official
``e2b-code-interpreter`` SDK.

Python and JavaScript run through ``run_code`` wrapped by ``remote_code`` (same ``main``
semantics and result channel as every other provider); bash goes through ``commands.run`` with
the code as the command (it is the user's own shell program, like ``run_command`` everywhere);
files through ``files``. The SDK is imported lazily so the provider lists without it installed.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from typing import Any

from ..agent.paths import PathViolation, check_syntax
from ..errors import (
    ConnectionFailedError,
    FileNotFoundInSandbox,
    InstanceCreationError,
    InvalidConfigError,
    PathError,
    ProviderUnavailableError,
    RateLimitError,
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
from .base import OutputCallback, SandboxProvider, check_run_inputs
from .e2b_config import MIN_SANDBOX_TTL, config_error, config_schema
from .e2b_config import sdk as _sdk
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

log = logging.getLogger("execbox.provider.e2b")

class E2BProvider(SandboxProvider):
    name = "e2b"
    display_name = "E2B"
    description = "E2B cloud sandboxes (Firecracker microVMs) via the official SDK."
    tags = ["cloud", "saas", "microvm"]
    # A Firecracker microVM per sandbox: at least as strong as our strongest tier.
    isolation = Isolation.GVISOR
    zero_config = False

    def __init__(self) -> None:
        super().__init__()
        self._sandboxes: dict[str, Any] = {}
        self._lock = threading.Lock()

    @staticmethod
    def get_config_schema() -> dict[str, dict[str, Any]]:
        return config_schema()

    def validate_config(self, config: dict[str, Any]) -> tuple[bool, str | None]:
        return config_error(config)

    def initialize(self, config: dict[str, Any]) -> bool:
        clean = check_config(self.get_config_schema(), config or {}, self.name)
        ok, message = self.validate_config(clean)
        if not ok:
            raise InvalidConfigError(f"invalid e2b configuration: {message}", details={"provider": self.name})
        _sdk()
        self.config = clean
        self.initialized = True
        return True

    def _conn(self) -> dict[str, Any]:
        """Connection options passed to every SDK call (never read from the process env)."""
        c = self.config
        opts: dict[str, Any] = {"api_key": c["api_key"]}
        if c.get("domain"):
            opts["domain"] = c["domain"]
        if c.get("api_url"):
            opts["api_url"] = c["api_url"]
        if c.get("sandbox_url"):
            opts["sandbox_url"] = c["sandbox_url"]
            opts["http_version"] = "1.1"
        return opts

    def _map_error(self, err: Exception, action: str) -> SandboxError:
        """SDK exceptions -> SB errors; the API key never appears (the SDK does not echo it)."""
        from e2b import exceptions as ex

        text = mask_secrets(str(err), [self.config.get("api_key")])
        details = {"provider": self.name, "action": action, "sdk_error": type(err).__name__}
        if is_connect_error(err):
            return ConnectionFailedError(f"e2b is not reachable while trying to {action}: {text}", details=details)
        if isinstance(err, ex.AuthenticationException):
            return ConnectionFailedError(f"e2b rejected the credentials while trying to {action}: {text}",
                                         details=details)
        if isinstance(err, ex.RateLimitException):
            return RateLimitError(f"e2b rate limit while trying to {action}: {text}", details=details)
        if isinstance(err, ex.NotFoundException):
            return FileNotFoundInSandbox(f"e2b: not found while trying to {action}: {text}", details=details)
        if isinstance(err, ex.InvalidArgumentException):
            return InvalidConfigError(f"e2b refused to {action}: {text}", details=details)
        if action == "create a sandbox":
            return InstanceCreationError(f"e2b could not {action}: {text}", details=details)
        return ProviderUnavailableError(f"e2b failed to {action}: {text}", details=details)

    # -- lifecycle ------------------------------------------------------------------------------
    def create_instance(self, template: str = "python", *, tenant_id: str = "default",
                        session_id: str | None = None) -> SandboxInstance:
        self._require_initialized()
        sdk = _sdk()
        instance_id = make_instance_id(tenant_id, session_id)
        ttl = max(MIN_SANDBOX_TTL, int(self.config["timeout"]) * 2)
        try:
            sandbox = sdk.Sandbox.create(
                template=self.config["template"], timeout=ttl,
                metadata={"tenant": tenant_id, "session": session_id or "oneshot", "instance_id": instance_id},
                allow_internet_access=bool(self.config["allow_internet_access"]), **self._conn())
        except Exception as e:  # noqa: BLE001 - every SDK failure becomes an SB error
            raise self._map_error(e, "create a sandbox") from e
        with self._lock:
            self._sandboxes[instance_id] = sandbox
        meta = {"tenant_id": tenant_id, "session_id": session_id, "sandbox_id": sandbox.sandbox_id,
                "template": self.config["template"], "isolation": self.isolation.value,
                "isolation_detail": "firecracker-microvm (e2b)"}
        return SandboxInstance(instance_id, self.name, "running", meta)

    def destroy_instance(self, instance_id: str) -> bool:
        with self._lock:
            sandbox = self._sandboxes.pop(instance_id, None)
        if sandbox is None:
            return False
        try:
            sandbox.kill()
        except Exception as e:  # noqa: BLE001 - the sandbox dies on its own TTL anyway
            log.warning("e2b: killing sandbox %s failed: %s", sandbox.sandbox_id, type(e).__name__)
        return True

    def health_check(self) -> bool:
        """The control plane answers a list call with these credentials."""
        if not self.initialized:
            return False
        sdk = _sdk()
        try:
            sdk.Sandbox.list(limit=1, **self._conn()).next_items()
            return True
        except Exception as e:  # noqa: BLE001
            log.info("e2b health check failed: %s", type(e).__name__)
            return False

    def get_supported_languages(self) -> list[str]:
        return [lang.value for lang in Language]

    def shutdown(self) -> None:
        with self._lock:
            ids = list(self._sandboxes)
        for i in ids:
            self.destroy_instance(i)
        self.initialized = False

    def _get(self, instance_id: str) -> Any:
        self._require_initialized()
        sandbox = self._sandboxes.get(instance_id)
        if sandbox is None:
            raise SessionNotFoundError(f"no instance {instance_id!r} in provider {self.name!r}",
                                       details={"instance_id": instance_id})
        return sandbox

    # -- execution ------------------------------------------------------------------------------
    def execute_code(self, instance_id: str, code: str, language: str, timeout: int = 10,
                     arguments: dict[str, Any] | None = None, *, context_id: str | None = None,
                     on_output: OutputCallback | None = None,
                     inline_artifacts: bool = False) -> ExecutionResult:
        sandbox = self._get(instance_id)
        lang = Language.parse(language)
        check_run_inputs(code, arguments, timeout)
        if context_id is not None:
            raise self._unsupported("stateful contexts (context_id)")
        if lang is Language.BASH:
            return self._run_command(sandbox, instance_id, code, float(timeout), None, None, on_output)
        marker = new_marker()
        wrapped = (wrap_python if lang is Language.PYTHON else wrap_javascript)(code, arguments, marker)
        callbacks: dict[str, Any] = {}
        if on_output is not None:
            callbacks = {"on_stdout": lambda m: on_output("stdout", m.line),
                         "on_stderr": lambda m: on_output("stderr", m.line)}
        started = time.monotonic()
        try:
            execution = sandbox.run_code(wrapped, language=lang.value, timeout=float(timeout), **callbacks)
        except Exception as e:  # noqa: BLE001
            if _is_timeout(e):
                return self._timed_out(instance_id, lang, time.monotonic() - started, timeout)
            raise self._map_error(e, "run code") from e
        wall = time.monotonic() - started
        return self._to_result(sandbox, instance_id, lang, execution, marker, wall)

    def _to_result(self, sandbox: Any, instance_id: str, lang: Language, execution: Any, marker: str,
                   wall: float) -> ExecutionResult:
        stdout, payload = extract_result("".join(execution.logs.stdout), marker)
        stderr = "".join(execution.logs.stderr)
        exit_code = 0
        err = execution.error
        if err is not None:
            exit_code = _exit_code_of(err)
            trace = err.traceback or f"{err.name}: {err.value}"
            stderr = f"{stderr}{'' if not stderr or stderr.endswith(chr(10)) else chr(10)}{trace}"
            if not stderr.endswith("\n"):
                stderr += "\n"
        present = bool(payload and payload.get("present"))
        artifacts = self._artifacts(sandbox, (payload or {}).get("artifacts") or [], execution.results)
        metadata = self._metadata(instance_id, lang)
        metadata.update(result_present=present, result_type=payload.get("type") if present else None,
                        peak_memory_kb=None, execution_count=execution.execution_count)
        if err is not None:
            metadata["error_name"] = err.name
        return ExecutionResult(stdout=stdout, stderr=stderr, exit_code=exit_code, execution_time=wall,
                               metadata=metadata, result=payload.get("value") if present else None,
                               artifacts=artifacts)

    def _metadata(self, instance_id: str, lang: Language) -> dict[str, Any]:
        return {"provider": self.name, "isolation": self.isolation.value,
                "isolation_detail": "firecracker-microvm (e2b)", "instance_id": instance_id,
                "language": lang.value}

    def _timed_out(self, instance_id: str, lang: Language, wall: float, timeout: float) -> ExecutionResult:
        metadata = self._metadata(instance_id, lang)
        metadata.update(error_code="SB005", error_message=f"execution timed out after {timeout:g}s",
                        result_present=False, result_type=None, peak_memory_kb=None)
        return ExecutionResult(stdout="", stderr="", exit_code=-1, execution_time=wall, metadata=metadata,
                               timed_out=True)

    def _artifacts(self, sandbox: Any, names: list[str], results: list[Any]) -> list[Artifact]:
        out: list[Artifact] = []
        for name in names[:50]:
            try:
                check_syntax(name)
                data = bytes(sandbox.files.read(self._abs(f"{ARTIFACTS_DIR}/{name}"), format="bytes"))
            except Exception as e:  # noqa: BLE001 - one unreadable file must not lose the run
                log.warning("e2b: artifact %r could not be read: %s", name, type(e).__name__)
                continue
            out.append(make_artifact(name, data))
        figure = 0
        for r in results:
            for attr, ext, binary in (("png", "png", True), ("jpeg", "jpg", True), ("svg", "svg", False)):
                value = getattr(r, attr, None)
                if value:
                    figure += 1
                    data = base64.b64decode(value) if binary else value.encode()
                    out.append(make_artifact(f"figure-{figure}.{ext}", data))
            chart = getattr(r, "chart", None)
            if chart is not None:
                figure += 1
                body = chart.to_dict() if hasattr(chart, "to_dict") else getattr(r, "raw", {}).get("chart")
                out.append(make_artifact(f"chart-{figure}.json", json.dumps(body, default=str).encode(),
                                         "application/json"))
        return out

    # -- commands -------------------------------------------------------------------------------
    def run_command(self, instance_id: str, command: str, timeout: int = 30, *, cwd: str | None = None,
                    env: dict[str, str] | None = None, on_output: OutputCallback | None = None) -> ExecutionResult:
        sandbox = self._get(instance_id)
        if not isinstance(command, str) or not command.strip():
            raise InvalidConfigError("command must be a non-empty string", details={"field": "command"})
        return self._run_command(sandbox, instance_id, command, float(timeout), cwd, env, on_output)

    def _run_command(self, sandbox: Any, instance_id: str, command: str, timeout: float, cwd: str | None,
                     env: dict[str, str] | None, on_output: OutputCallback | None) -> ExecutionResult:
        from e2b.sandbox.commands.command_handle import CommandExitException

        kwargs: dict[str, Any] = {"timeout": timeout, "cwd": self._abs(cwd or ".")}
        if env:
            kwargs["envs"] = dict(env)
        if on_output is not None:
            kwargs["on_stdout"] = lambda s: on_output("stdout", s)
            kwargs["on_stderr"] = lambda s: on_output("stderr", s)
        started = time.monotonic()
        try:
            res = sandbox.commands.run(command, **kwargs)
            stdout, stderr, exit_code = res.stdout, res.stderr, res.exit_code
        except CommandExitException as e:  # non-zero exit: still a result
            stdout, stderr, exit_code = e.stdout, e.stderr, e.exit_code
        except Exception as e:  # noqa: BLE001
            if _is_timeout(e):
                return self._timed_out(instance_id, Language.BASH, time.monotonic() - started, timeout)
            raise self._map_error(e, "run a command") from e
        metadata = self._metadata(instance_id, Language.BASH)
        metadata.update(result_present=False, result_type=None, peak_memory_kb=None)
        return ExecutionResult(stdout=stdout, stderr=stderr, exit_code=int(exit_code),
                               execution_time=time.monotonic() - started, metadata=metadata)

    # -- files ----------------------------------------------------------------------------------
    def _abs(self, path: str) -> str:
        """Workspace-relative path -> absolute sandbox path, validated by agent.paths."""
        try:
            rel = check_syntax(path)
        except PathViolation as e:
            raise PathError(str(e), details={"path": e.path, "reason": e.reason}) from None
        root = self.config["workdir"].rstrip("/")
        return root if rel == "." else f"{root}/{rel}"

    def read_bytes(self, instance_id: str, path: str) -> bytes:
        sandbox = self._get(instance_id)
        target = self._abs(path)
        try:
            return bytes(sandbox.files.read(target, format="bytes"))
        except Exception as e:  # noqa: BLE001
            raise self._map_error(e, f"read {path}") from e

    def read_file(self, instance_id: str, path: str, offset: int = 0, limit: int = 2000) -> TextPage:
        return text_page(path, self.read_bytes(instance_id, path), offset, limit)

    def write_file(self, instance_id: str, path: str, content: str | bytes, mode: str = "overwrite") -> FileInfo:
        sandbox = self._get(instance_id)
        target = self._abs(path)
        if mode not in ("overwrite", "append"):
            raise InvalidConfigError("mode must be 'overwrite' or 'append'", details={"field": "mode"})
        data = content.encode() if isinstance(content, str) else content
        if not isinstance(data, bytes):
            raise InvalidConfigError("content must be str or bytes", details={"field": "content"})
        try:
            if mode == "append":
                try:
                    data = bytes(sandbox.files.read(target, format="bytes")) + data
                except Exception as e:  # noqa: BLE001
                    from e2b import exceptions as ex

                    if not isinstance(e, ex.NotFoundException):
                        raise
            sandbox.files.write(target, data)
        except SandboxError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._map_error(e, f"write {path}") from e
        return FileInfo(path=check_syntax(path), size=len(data), is_dir=False, modified=time.time())


    def write_files(self, instance_id: str, files: dict[str, str | bytes]) -> list[FileInfo]:
        """All files in one upload request: envd writes the whole multipart body or fails it."""
        sandbox = self._get(instance_id)
        entries, infos = [], []
        for path, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            if not isinstance(data, bytes):
                raise InvalidConfigError("content must be str or bytes", details={"field": "content", "path": path})
            entries.append({"path": self._abs(path), "data": data})
            infos.append(FileInfo(path=check_syntax(path), size=len(data), is_dir=False, modified=time.time()))
        if not entries:
            return []
        try:
            sandbox.files.write_files(entries)
        except Exception as e:  # noqa: BLE001
            raise self._map_error(e, "write files") from e
        return infos


def _is_timeout(err: Exception) -> bool:
    from e2b import exceptions as ex

    return isinstance(err, ex.TimeoutException) and not isinstance(
        err, (ex.SandboxNotRunningException, ex.SandboxUnreachableException))


def _exit_code_of(err: Any) -> int:
    if err.name == "SystemExit":
        value = str(err.value).strip()
        if value.lstrip("-").isdigit():
            return int(value) or 0
    return 1
