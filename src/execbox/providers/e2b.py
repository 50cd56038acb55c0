"""Provider ``e2b``: E2B cloud sandboxes (Firecracker microVMs) through the official
``e2b-code-interpreter`` SDK.

Every run and file operation goes through execbox's own agent, uploaded into the sandbox once
(providers/remote_agent.py) and run per request with ``commands.run``; the SDK's ``files`` API
only carries the upload. So results, caps, artifacts, plots, path checks and error codes are the
same as on every self-hosted provider. The SDK is imported lazily so the provider lists without
it installed.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

from ..boxes.agent_client import MAX_REPLY_FRAME
from ..errors import (
    ConnectionFailedError,
    FileNotFoundInSandbox,
    InstanceCreationError,
    InvalidConfigError,
    ProviderUnavailableError,
    RateLimitError,
    SandboxError,
    SessionNotFoundError,
)
from ..models import ExecutionResult, Isolation, Language, SandboxInstance, make_instance_id
from .agent_files import AgentFilesMixin
from .base import OutputCallback, SandboxProvider
from .cloud_errors import is_connect_error, mask_secrets
from .e2b_config import MIN_SANDBOX_TTL, config_error, config_schema
from .e2b_config import sdk as _sdk
from .remote_agent import FILE_OP_TIMEOUT, AgentRunsMixin, RemoteAgent, shell_quote
from .schema import check_config, parse_size

log = logging.getLogger("execbox.provider.e2b")

class E2BProvider(AgentRunsMixin, AgentFilesMixin, SandboxProvider):
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
        self._agents: dict[str, RemoteAgent] = {}
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
            self._agents.pop(instance_id, None)
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

    def _sandbox(self, instance_id: str) -> Any:
        self._require_initialized()
        sandbox = self._sandboxes.get(instance_id)
        if sandbox is None:
            raise SessionNotFoundError(f"no instance {instance_id!r} in provider {self.name!r}",
                                       details={"instance_id": instance_id})
        return sandbox

# -- execution ------------------------------------------------------------------------------
    def _get(self, instance_id: str) -> RemoteAgent:
        """The sandbox's agent (AgentFilesMixin calls every file operation through it)."""
        sandbox = self._sandbox(instance_id)
        with self._lock:
            agent = self._agents.get(instance_id)
            if agent is None:
                agent = self._agents[instance_id] = RemoteAgent(_Transport(self, sandbox), self.config["workdir"],
                                                                self.name, runs_in_workspace=True)
        return agent

    def _call(self, agent: RemoteAgent, op: str, params: dict[str, Any], timeout: float = FILE_OP_TIMEOUT,
              on_output: OutputCallback | None = None) -> Any:
        return agent.call(op, params, timeout, on_output)

    def _exec(self, instance_id: str, params: dict[str, Any], timeout: float, on_output: OutputCallback | None,
              inline_artifacts: bool) -> ExecutionResult:
        agent = self._get(instance_id)
        if self.config.get("max_memory"):  # the agent's per-run limit: a bomb is its MemoryError, not the VM's OOM
            params = {**params, "limits": {"memory_bytes": parse_size(self.config["max_memory"])}}
        metadata = {"provider": self.name, "isolation": self.isolation.value,
                    "isolation_detail": "firecracker-microvm (e2b)", "instance_id": instance_id}
        return agent.execute(params, timeout, metadata, on_output, inline_artifacts,
                             lambda path: self.read_bytes(instance_id, path))


class _Transport:
    """E2B's side of remote_agent: ``files.write_files`` uploads, ``commands.run`` runs."""

    def __init__(self, provider: E2BProvider, sandbox: Any) -> None:
        self.provider = provider
        self.sandbox = sandbox

    @functools.cached_property
    def _sdk_can_drop_output(self) -> bool:
        """Whether this SDK's ``commands.run`` takes ``retain_output`` (looked up once per sandbox)."""
        return _accepts(self.sandbox.commands.run, "retain_output")

    def upload(self, files: dict[str, bytes]) -> None:
        try:
            self.sandbox.files.write_files([{"path": p, "data": d} for p, d in files.items()])
        except Exception as e:  # noqa: BLE001
            raise self.provider._map_error(e, "upload to the sandbox") from e

    def run(self, argv: list[str], timeout: float, on_stdout: Callable[[str], None] | None) -> tuple[str, str]:
        """The agent's stdout and stderr, collected here with a bound: tenant code can replace the
        agent in its sandbox, and the SDK would otherwise keep whatever it prints in memory."""
        from e2b.sandbox.commands.command_handle import CommandExitException

        out = _Bounded(STDOUT_CAP, "stdout", on_stdout)
        err = _Bounded(STDERR_CAP, "stderr", None)
        kwargs: dict[str, Any] = {"timeout": timeout, "cwd": self.provider.config["workdir"],
                                  "on_stdout": out.add, "on_stderr": err.add}
        if self._sdk_can_drop_output:
            kwargs["retain_output"] = False  # our callbacks keep what is needed, bounded
        try:
            self.sandbox.commands.run(shell_quote(argv), **kwargs)
            return out.text(), err.text()
        except CommandExitException:  # the agent's reply (an error one) is still on stdout
            return out.text(), err.text()
        except TooMuchOutput as e:
            raise ProviderUnavailableError(
                f"e2b: the sandbox's agent sent more than {e.cap} bytes on {e.stream}; stopped reading it",
                details={"provider": "e2b", "limit_bytes": e.cap}) from None
        except Exception as e:  # noqa: BLE001
            if _is_timeout(e):
                raise ProviderUnavailableError(f"e2b: the agent did not answer within {timeout:g}s",
                                               details={"provider": "e2b", "timeout": timeout}) from e
            raise self.provider._map_error(e, "run the agent") from e


STDOUT_CAP = 2 * MAX_REPLY_FRAME
"""The most agent stdout kept per command: its events and its one reply (itself refused past the
frame limit by remote_agent)."""
STDERR_CAP = 1024 * 1024
"""stderr only feeds diagnostics (its tail): anything past this is dropped, not an error."""


class TooMuchOutput(Exception):
    def __init__(self, stream: str, cap: int) -> None:
        super().__init__(stream)
        self.stream, self.cap = stream, cap


class _Bounded:
    """Chunks of one stream, at most ``cap`` characters; stdout past it stops the command's read
    (the SDK re-raises a callback's exception from ``commands.run``), stderr is just cut."""

    def __init__(self, cap: int, stream: str, forward: Callable[[str], None] | None) -> None:
        self.cap, self.stream, self.forward = cap, stream, forward
        self.chunks: list[str] = []
        self.size = 0

    def add(self, chunk: str) -> None:
        room = self.cap - self.size
        if len(chunk) > room:
            if self.stream == "stdout":
                raise TooMuchOutput(self.stream, self.cap)
            chunk = chunk[:max(room, 0)]
        if chunk:
            self.chunks.append(chunk)
            self.size += len(chunk)
            if self.forward is not None:
                self.forward(chunk)

    def text(self) -> str:
        return "".join(self.chunks)


def _accepts(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _is_timeout(err: Exception) -> bool:
    from e2b import exceptions as ex

    return isinstance(err, ex.TimeoutException) and not isinstance(
        err, (ex.SandboxNotRunningException, ex.SandboxUnreachableException))

