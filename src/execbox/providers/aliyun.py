"""Provider ``aliyun_codeinterpreter``: Alibaba Cloud AgentRun code-interpreter sandboxes through
the official ``agentrun-sdk`` (serverless microVMs, 30-second hard execution limit).

Config keys follow the RAGFlow design (access_key_id, access_key_secret, account_id, region,
template_name, timeout) with ``AGENTRUN_*`` environment fallbacks. Every SDK call gets the same
explicit ``Config`` (RAGFlow's provider forgot it on delete). Runs and file operations go
through execbox's own agent, uploaded once per sandbox with the file API and run per request from
a context ``execute`` cell (providers/remote_agent.py), so their semantics are the agent's. The cell
is always Python (it starts the agent); the user's language is the agent's, so bash runs too, with
the template's ``/bin/bash`` (a template without bash makes a bash run SB002 naming it).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import (
    ConnectionFailedError,
    FileNotFoundInSandbox,
    InstanceCreationError,
    InvalidConfigError,
    ProviderUnavailableError,
    SandboxError,
    SessionNotFoundError,
)
from ..models import ExecutionResult, Isolation, Language, SandboxInstance, make_instance_id
from .agent_files import AgentFilesMixin
from .aliyun_config import (
    DEFAULT_TEMPLATE,
    HARD_TIMEOUT,
    WORKDIR,
    config_error,
    config_schema,
    with_env_fallbacks,
)
from .base import OutputCallback, SandboxProvider
from .cloud_errors import is_connect_error, mask_secrets
from .remote_agent import FILE_OP_TIMEOUT, AgentRunsMixin, RemoteAgent, python_cell
from .schema import check_config

log = logging.getLogger("execbox.provider.aliyun")
BASH_PROBE = "import os, shutil\nprint(bool(shutil.which('bash') or os.path.exists('/bin/bash')))"
"""The agent runs ``bash`` from PATH, else /bin/bash (agent/main.py)."""

class AliyunCodeInterpreterProvider(AgentRunsMixin, AgentFilesMixin, SandboxProvider):
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
        self._agents: dict[str, RemoteAgent] = {}  # instance id -> its uploaded agent
        self._has_bash: dict[str, bool] = {}  # instance id -> whether its sandbox has bash (asked on a failure)
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
            self._agents.pop(instance_id, None)
            self._has_bash.pop(instance_id, None)
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
        return [lang.value for lang in Language]  # the agent's languages: the cell only starts it

    def shutdown(self) -> None:
        for instance_id in list(self._sandbox_ids):
            self.destroy_instance(instance_id)
        self.initialized = False

    # -- execution ------------------------------------------------------------------------------
    def _get(self, instance_id: str) -> RemoteAgent:
        """The sandbox's agent (AgentFilesMixin calls every file operation through it)."""
        sandbox = self._sandbox(instance_id)
        with self._lock:
            agent = self._agents.get(instance_id)
            if agent is None or agent.transport.sandbox is not sandbox:
                uploaded = agent is not None and agent.uploaded  # a reconnect keeps the sandbox's files
                agent = self._agents[instance_id] = RemoteAgent(_Transport(self, sandbox), WORKDIR, self.name)
                agent.uploaded = uploaded
        return agent

    def _call(self, agent: RemoteAgent, op: str, params: dict[str, Any], timeout: float = FILE_OP_TIMEOUT,
              on_output: OutputCallback | None = None) -> Any:
        return agent.call(op, params, min(timeout, HARD_TIMEOUT), on_output)

    def _check_hard_limit(self, timeout: float) -> None:
        if timeout > HARD_TIMEOUT:
            raise InvalidConfigError(f"timeout {timeout:g}s exceeds aliyun_codeinterpreter's hard limit of "
                                     f"{HARD_TIMEOUT}s", details={"field": "timeout", "max": HARD_TIMEOUT})

    def _exec(self, instance_id: str, params: dict[str, Any], timeout: float, on_output: OutputCallback | None,
              inline_artifacts: bool) -> ExecutionResult:
        agent = self._get(instance_id)
        metadata = {"provider": self.name, "isolation": self.isolation.value,
                    "isolation_detail": "serverless-microvm (agentrun)", "instance_id": instance_id}
        started = time.monotonic()
        try:
            # The service answers a cell once: output arrives at the end, through the same callback.
            result = agent.execute(params, timeout, metadata, on_output, inline_artifacts,
                                   lambda path: self.read_bytes(instance_id, path))
        except TimeoutError:  # the service's own hard limit ended the cell before the agent replied
            metadata.update(language=params["language"], error_code="SB005", result_present=False,
                            result_type=None,
                            error_message=f"execution hit the service's hard limit of {HARD_TIMEOUT}s")
            return ExecutionResult(stdout="", stderr="", exit_code=-1, execution_time=time.monotonic() - started,
                                   metadata=metadata, timed_out=True)
        if params["language"] == "bash" and result.exit_code != 0 and not result.timed_out:
            self._require_bash(instance_id, agent)
        return result

    def _require_bash(self, instance_id: str, agent: RemoteAgent) -> None:
        """After a failed bash run, once per sandbox: SB002 naming the template when it has no bash
        (the agent would only say that exec failed), instead of a puzzling result."""
        has = self._has_bash.get(instance_id)
        if has is None:
            probe = agent.execute({"language": "python", "code": BASH_PROBE,
                                   "arguments": None}, 10.0, {}, None, False, lambda path: b"")
            has = self._has_bash[instance_id] = probe.stdout.strip() != "False"
        if not has:
            raise InvalidConfigError(f"bash is not installed in the AgentRun template {self.template_name()!r}: "
                                     "execbox runs bash through its agent there and needs /bin/bash in the image",
                                     details={"field": "language", "value": "bash", "provider": self.name},
                                     http_status=501)


class _Transport:
    """AgentRun's side of remote_agent: ``file_system.upload`` uploads, a python cell runs."""

    def __init__(self, provider: AliyunCodeInterpreterProvider, sandbox: Any) -> None:
        self.provider = provider
        self.sandbox = sandbox

    def upload(self, files: dict[str, bytes]) -> None:
        try:
            with tempfile.TemporaryDirectory(prefix="execbox-agentrun-") as tmp:
                for i, (remote, data) in enumerate(files.items()):
                    local = os.path.join(tmp, f"upload-{i}")
                    with open(local, "wb") as f:
                        f.write(data)
                    self.sandbox.file_system.upload(local, remote)
        except Exception as e:  # noqa: BLE001
            raise self.provider._map_error(e, "upload to the sandbox") from e

    def run(self, argv: list[str], timeout: float, on_stdout: Callable[[str], None] | None) -> tuple[str, str]:
        try:
            raw = self.sandbox.context.execute(code=python_cell(argv), language="python",
                                               timeout=max(1, min(HARD_TIMEOUT, int(round(timeout)))))
        except Exception as e:  # noqa: BLE001
            raise self.provider._map_error(e, "run the agent") from e
        items = raw.get("results") if isinstance(raw, dict) else None
        if not isinstance(items, list):
            raise ProviderUnavailableError("agentrun answered an execute call without a results list",
                                           details={"provider": self.provider.name})
        ends = [str(i.get("status") or "") for i in items if i.get("type") == "endOfExecution"]
        if ends and ends[-1].lower() in ("timeout", "timedout", "timed_out"):
            raise TimeoutError(f"agentrun ended the cell at its {HARD_TIMEOUT}s limit")
        # Output items are lines or raw chunks; the agent's lines are JSON, so newlines separate them.
        stdout = "\n".join(str(i.get("text", "")).rstrip("\n") for i in items if i.get("type") == "stdout")
        if on_stdout is not None:
            on_stdout(stdout + "\n")
        stderr = "\n".join(str(i.get("text") or i.get("traceback") or "") for i in items
                           if i.get("type") in ("stderr", "error"))
        return stdout, stderr
