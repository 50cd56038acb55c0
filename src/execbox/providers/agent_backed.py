"""Shared implementation for self-hosted providers whose boxes run the execbox agent.

A subclass only says how to start a box (``start_box``) and which limits it applies; every
operation here is one request to the box's agent. Warm pool, AST policy, result mapping and
SB error mapping live here once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from abc import abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..boxes.agent_client import BoxDied
from ..boxes.box import Box
from ..boxes.pool import BoxPool
from ..boxes.quota import QuotaUnavailable
from ..egress.policy import EgressPolicy
from ..errors import (
    SEE_LOG,
    BoxStartFailed,
    InvalidConfigError,
    ProviderUnavailableError,
    SandboxError,
    SessionNotFoundError,
)
from ..models import (
    ExecutionResult,
    Language,
    SandboxInstance,
    make_instance_id,
)
from ..policy import AstPolicy
from .agent_egress import AgentEgressMixin, egress_link
from .agent_files import AgentFilesMixin
from .agent_procs import BackgroundProcesses
from .agent_result import result_from_reply
from .base import OutputCallback, SandboxProvider, check_code_and_arguments, check_timeout
from .schema import check_config

log = logging.getLogger("execbox.provider")

AGENT_GRACE = 10.0  # seconds past an execution's own timeout before the host gives up on a box
FILE_OP_TIMEOUT = 60.0
DEFAULT_OUTPUT_CAP = 1024 * 1024

TIMEOUT_SCHEMA: dict[str, dict[str, Any]] = {
    "timeout": {"type": "integer", "default": 30, "min": 1, "max": 3600, "label": "Default timeout (s)",
                "description": "Default execution timeout in seconds."},
    "max_timeout": {"type": "integer", "default": 3600, "min": 1, "max": 86400, "label": "Max timeout (s)",
                    "description": "Largest timeout a caller may ask for."},
}

POLICY_SCHEMA: dict[str, dict[str, Any]] = {
    "enable_ast_analysis": {
        "type": "boolean", "default": False, "label": "AST policy",
        "description": "Lint Python code before running it and block configured imports/calls (SB007). "
                       "A guard rail, not the security boundary.",
    },
    "blocked_imports": {
        "type": "list", "label": "Blocked imports",
        "description": "Modules the AST policy blocks (comma-separated). Empty = built-in list.",
    },
    "blocked_calls": {
        "type": "list", "label": "Blocked calls",
        "description": "Dotted call names the AST policy blocks, e.g. os.system, eval.",
    },
}


@dataclass
class Instance:
    instance_id: str
    box: Box
    tenant_id: str
    session_id: str | None
    created_at: float = field(default_factory=time.time)
    executions: int = 0
    from_pool: bool = False
    egress: EgressPolicy | None = None  # the session's network policy (None: the provider's cap)
    egress_run: EgressPolicy | None = None  # a run's narrowing of it, while that run lasts
    egress_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    runtime: str | None = None  # runtime template asked for at create_instance (None: the provider's)


START_SLOTS_PER_CPU = 2
"""Callers' own box starts run at most this many per CPU at once; the rest queue for a slot.

A start is CPU work with short waits (exec, mounts, the agent's imports): two per CPU keep the
CPUs busy, and more only add contention (sustained one-shots at c=16 on 2 cores, 4 slots against
none: 58.5-61.1 vs 51.3-57.7 runs/s, CPU 30.4-31.6 vs 32.4-36.7 ms per one-shot; 2 slots left
CPUs idle: 51.5-54.7)."""


class AgentBackedProvider(AgentFilesMixin, AgentEgressMixin, BackgroundProcesses, SandboxProvider):
    warm_pool_wait = 0.0  # seconds create_instance waits for a pooled box before starting one

    def __init__(self) -> None:
        super().__init__()
        self._instances: dict[str, Instance] = {}
        self._lock = threading.Lock()
        self._admit_lock = threading.Lock()
        self._admitting: dict[str, int] = {}  # tenant -> boxes admitted and still starting
        self._start_slots = threading.BoundedSemaphore(START_SLOTS_PER_CPU * (os.cpu_count() or 1))
        self._pool: BoxPool | None = None
        self._policy: AstPolicy | None = None

    # -- what a backend provides ------------------------------------------------------------
    @abstractmethod
    def start_box(self, workspace: str | None = None) -> Box:
        """Start a box with its agent ready; ``workspace`` reuses an existing host directory."""

    def start_pooled_box(self) -> Box:
        """A warm-pool refill (the jail starts it at a low CPU weight until it is handed out)."""
        return self.start_box()

    pool_box_stale: Callable[[Any], bool] | None = None
    """Whether a ready pooled box no longer fits what a new instance would get (the jail's: its
    default runtime template moved on); None: pooled boxes never go stale."""

    def start_oneshot_box(self, runtime: str | None = None) -> Box:
        """A box for one run and no session (the pool had none): nothing of it outlives the run."""
        return self.start_box() if runtime is None else self.start_box_with_runtime(None, runtime)

    def start_box_with_runtime(self, workspace: str | None, runtime: str) -> Box:
        """Start a box that runs runtime template ``runtime``; backends without templates refuse."""
        raise InvalidConfigError(f"provider {self.name!r} does not support runtime templates "
                                 f"(runtime={runtime!r}); they work on the jail provider",
                                 details={"provider": self.name, "field": "runtime", "value": runtime})

    template_in_limits = False
    """``applied_limits()['runtime']`` names the runtime template (the jail's), which a run reports
    as its instance's; Docker's names the OCI runtime (runc, runsc)."""

    def applied_limits(self) -> dict[str, Any]:
        return {"timeout": self.config.get("timeout"), "max_output_bytes": self.output_cap}

    def warnings(self) -> list[str]:
        return []

    # -- lifecycle --------------------------------------------------------------------------
    def initialize(self, config: dict[str, Any]) -> bool:
        clean = check_config(self.get_config_schema(), config or {}, self.name)
        ok, message = self.validate_config(clean)
        if not ok:
            raise InvalidConfigError(f"invalid {self.name} configuration: {message}",
                                     details={"provider": self.name, "message": message})
        self.config = clean
        if clean.get("enable_ast_analysis"):
            self._policy = AstPolicy.from_config(clean.get("blocked_imports") or None,
                                                 clean.get("blocked_calls") or None)
        self.prepare()
        size = int(clean.get("pool_size") or 0)
        if size:
            self._pool = BoxPool(self.start_pooled_box, size, name=self.name, stale=self.pool_box_stale)
        self.initialized = True
        return True

    def prepare(self) -> None:
        """Backend checks run once at initialize (binaries present, cgroups usable, ...)."""

    @property
    def output_cap(self) -> int:
        return int(self.config.get("max_output_bytes") or DEFAULT_OUTPUT_CAP)

    def pool_status(self) -> dict[str, Any] | None:
        return self._pool.status() if self._pool else None

    def create_instance(self, template: str = "python", *, tenant_id: str = "default",
                        session_id: str | None = None, workspace: str | None = None,
                        runtime: str | None = None) -> SandboxInstance:
        """``runtime`` names a runtime template (``NAME`` or ``NAME@vN``) for this instance only."""
        self._require_initialized()
        with self.admitted(tenant_id):
            return self._create_admitted(template, tenant_id, session_id, workspace, runtime)

    @contextlib.contextmanager
    def admitted(self, tenant_id: str) -> Iterator[None]:
        """``admit`` and count the box as the tenant's until the block ends (by then it is in
        ``_instances`` or failed): checked and counted under one lock, so concurrent creates
        cannot all pass a per-tenant cap before any of them is registered."""
        with self._admit_lock:
            self.admit(tenant_id)
            self._admitting[tenant_id] = self._admitting.get(tenant_id, 0) + 1
        try:
            yield
        finally:
            with self._admit_lock:
                left = self._admitting[tenant_id] - 1
                if left:
                    self._admitting[tenant_id] = left
                else:
                    del self._admitting[tenant_id]

    def _create_admitted(self, template: str, tenant_id: str, session_id: str | None, workspace: str | None,
                         runtime: str | None) -> SandboxInstance:
        instance_id = make_instance_id(tenant_id, session_id)
        box = None
        runtime = runtime or None
        if self._pool is not None and workspace is None and runtime is None:
            box = self._pool.take(self.warm_pool_wait)
        elif self._pool is not None and workspace is not None and runtime is None:
            box = self.adopt_pooled(self._pool, workspace)
        from_pool = box is not None
        if box is None:
            cold = self._pool.cold_start() if self._pool is not None else contextlib.nullcontext()
            try:
                with cold, self._start_slots:
                    if session_id is None and workspace is None:
                        box = self.start_oneshot_box(runtime)
                    elif runtime is None:
                        box = self.start_box(workspace)
                    else:
                        box = self.start_box_with_runtime(workspace, runtime)
            except SandboxError:
                raise
            except Exception as e:  # noqa: BLE001
                raise box_start_failed(self.name, e) from e
        if workspace is not None or session_id is not None:
            box.keep_workspace = workspace is not None
        inst = Instance(instance_id, box, tenant_id, session_id, from_pool=from_pool, runtime=runtime)
        self._bind_egress(inst)
        with self._lock:
            self._instances[instance_id] = inst
        return SandboxInstance(instance_id, self.name, "running", self._instance_metadata(inst))

    def admit(self, tenant_id: str) -> None:
        """Checks a new session must pass before it gets a box (raise its SB error); none here."""

    def tenant_boxes(self, tenant_id: str) -> int:
        """The tenant's boxes, those still starting included (called under ``_admit_lock``)."""
        with self._lock:
            live = sum(1 for inst in self._instances.values() if inst.tenant_id == tenant_id)
        return live + self._admitting.get(tenant_id, 0)

    def _instance_metadata(self, inst: Instance) -> dict[str, Any]:
        return {
            "isolation": self.isolation.value, "tenant_id": inst.tenant_id, "session_id": inst.session_id,
            "from_pool": inst.from_pool, "workspace": inst.box.workspace, **inst.box.info(),
            "network": self.effective_network(inst.instance_id, inst),
        }

    def destroy_instance(self, instance_id: str) -> bool:
        with self._lock:
            inst = self._instances.pop(instance_id, None)
        if inst is None:
            return False
        inst.box.destroy()
        return True

    def instance_alive(self, instance_id: str) -> bool:
        inst = self._instances.get(instance_id)
        return bool(inst and inst.box.alive())

    def files_beside_runs(self, instance_id: str) -> bool:
        """Whether the box's agent serves file operations while a run goes on (it says so when
        it starts, or in its ping answer when a box is re-attached after a restart)."""
        inst = self._instances.get(instance_id)
        return bool(inst and inst.box.alive() and inst.box.client.beside_run)

    def list_instances(self) -> list[SandboxInstance]:
        with self._lock:
            insts = list(self._instances.values())
        return [SandboxInstance(i.instance_id, self.name, "running" if i.box.alive() else "error",
                                self._instance_metadata(i)) for i in insts]

    def health_check(self) -> bool:
        if not self.initialized:
            return False
        ok, _ = self.availability()
        return ok

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        with self._lock:
            insts = list(self._instances.values())
            self._instances.clear()
        for inst in insts:
            try:
                inst.box.destroy()
            except Exception:  # noqa: BLE001
                log.exception("destroying %s failed", inst.instance_id)
        self.initialized = False

    def _get(self, instance_id: str) -> Instance:
        self._require_initialized()
        inst = self._instances.get(instance_id)
        if inst is None:
            raise SessionNotFoundError(f"no instance {instance_id!r} in provider {self.name!r}",
                                       details={"instance_id": instance_id})
        return inst

    def _call(self, inst: Instance, op: str, params: dict[str, Any], timeout: float = FILE_OP_TIMEOUT,
              on_output: OutputCallback | None = None) -> Any:
        try:
            return inst.box.client.call(op, params, timeout=timeout, on_event=on_output)
        except BoxDied as e:
            self._box_died(inst, e)
            raise AssertionError("unreachable") from e

    def _box_died(self, inst: Instance, err: BoxDied) -> None:
        oom = inst.box.oom_events() > 0
        inst.box.destroy()
        if oom:
            from ..errors import OutOfMemoryError

            raise OutOfMemoryError(f"box of {inst.instance_id} was killed for exceeding its memory limit",
                                   details={"instance_id": inst.instance_id})
        raise ProviderUnavailableError(
            f"the box of instance {inst.instance_id} died: {err.message}",
            details={"instance_id": inst.instance_id, "provider": self.name, "box_died": True},
        )

    def get_supported_languages(self) -> list[str]:
        return [lang.value for lang in Language]

    # -- execution --------------------------------------------------------------------------
    def execute_code(self, instance_id: str, code: str, language: str, timeout: int = 10,
                     arguments: dict[str, Any] | None = None, *, context_id: str | None = None,
                     on_output: OutputCallback | None = None, inline_artifacts: bool = False) -> ExecutionResult:
        return self._exec(instance_id, self._exec_params(code, language, arguments, context_id),
                          timeout, on_output, inline_artifacts)

    def _exec_params(self, code: str, language: str, arguments: dict[str, Any] | None,
                     context_id: str | None) -> dict[str, Any]:
        """An ``exec`` request's code part, once the code passed its checks."""
        lang = Language.parse(language)
        check_code_and_arguments(code, arguments)
        self.check_code_policy(code, lang)
        return {"language": lang.value, "code": code, "arguments": arguments, "context_id": context_id}

    def run_command(self, instance_id: str, command: str, timeout: int = 30, *, cwd: str | None = None,
                    env: dict[str, str] | None = None, on_output: OutputCallback | None = None,
                    context_id: str | None = None, start_env: dict[str, str] | None = None) -> ExecutionResult:
        """``context_id``: run in that bash context (agent/bash_contexts.py), whose variables and
        working directory persist (E2B's bash cells). ``cwd`` and ``start_env`` are then where and
        with what environment a new context starts; ``env`` is set for this command and put back
        after it."""
        if not isinstance(command, str) or not command.strip():
            raise InvalidConfigError("command must be a non-empty string", details={"field": "command"})
        return self._exec(instance_id, {"language": "bash", "code": command, "cwd": cwd, "env": env or {},
                                        "context_id": context_id, "start_env": start_env or {}},
                          timeout, on_output, False)

    def _check_timeout(self, timeout: Any) -> float:
        seconds = check_timeout(timeout)
        limit = self.config.get("max_timeout")
        if limit and timeout > limit:
            raise InvalidConfigError(f"timeout {timeout}s exceeds this provider's maximum of {limit}s",
                                     details={"field": "timeout", "max": limit})
        return seconds

    def _exec(self, instance_id: str, params: dict[str, Any], timeout: Any, on_output: OutputCallback | None,
              inline_artifacts: bool) -> ExecutionResult:
        inst = self._get(instance_id)
        seconds = self._check_timeout(timeout)
        oom_before = inst.box.oom_events()
        request = {**params, "timeout": seconds, "output_cap": self.output_cap, "stream": on_output is not None,
                   "inline_artifacts": inline_artifacts}
        started = time.monotonic()
        link = egress_link(inst.box)
        run_id = uuid.uuid4().hex[:16] if link is not None else None
        if link is not None:
            link.run_id = run_id  # egress audit rows of this run carry it
        try:
            value = self._call(inst, "exec", request, timeout=seconds + AGENT_GRACE, on_output=on_output)
        finally:
            if link is not None:
                link.run_id = None
        inst.executions += 1
        oom = bool(value.get("oom")) or inst.box.oom_events() > oom_before
        result = self._to_result(inst, value, time.monotonic() - started, oom)
        # this run's limits, not the provider's defaults: a 1 s run that timed out said 30, and a
        # session on runtime "sci" or a narrowed policy showed the provider's "system" and mode
        limits = result.metadata["limits"]
        limits["timeout"] = int(seconds) if seconds == int(seconds) else seconds
        if "network" in limits and isinstance(result.metadata.get("network"), dict):
            limits["network"] = result.metadata["network"].get("network", limits["network"])
        if run_id is not None:
            result.metadata["egress_run_id"] = run_id
        ref = self.runtime_ref(inst)
        if ref:
            result.metadata["runtime"] = ref
            if self.template_in_limits:
                limits["runtime"] = ref
        return result

    @staticmethod
    def runtime_ref(inst: Instance) -> str | None:
        """``NAME@vN`` of the runtime template the instance's box runs (None: not a template)."""
        ref = getattr(getattr(inst.box, "runtime", None), "ref", None)
        return ref or inst.runtime

    def _to_result(self, inst: Instance, v: dict[str, Any], wall: float, oom: bool) -> ExecutionResult:
        metadata: dict[str, Any] = {
            "provider": self.name,
            "isolation": self.isolation.value,
            "instance_id": inst.instance_id,
            "limits": self.applied_limits(),
            "network": self.effective_network(inst.instance_id, inst),
        }
        warnings = self.warnings()
        if self.selection_note:
            metadata["selection_note"] = self.selection_note
        if warnings:
            metadata["warnings"] = warnings
        return result_from_reply(v, metadata, oom=oom, wall=wall, fetch=self._artifact_fetcher(inst.instance_id))

    def _artifact_fetcher(self, instance_id: str):
        return lambda path: self.read_bytes(instance_id, path)

    def cancel(self, instance_id: str) -> bool:
        inst = self._instances.get(instance_id)
        return bool(inst and inst.box.client.cancel())


def box_start_failed(provider: str, e: BaseException, what: str = "a box") -> BoxStartFailed:
    """SB004 for a box start that failed with ``e``: logged whole (host paths: the log only), the
    tenant's message cut to what ``tenant_safe`` lets through."""
    log.warning("%s: could not start %s: %s", provider, what, e)
    return BoxStartFailed(f"{provider}: could not start {what}: {tenant_safe(e)}", f"{type(e).__name__}: {e}",
                          details={"provider": provider})


def tenant_pool_view(pool: BoxPool) -> dict[str, Any]:
    """``pool.status()`` as a tenant may read it: the pool keeps its last start failure whole (host
    paths and all, for the log and ``doctor``); here it is cut by ``tenant_safe``."""
    failed = pool.last_exception
    return {**pool.status(), "last_error": tenant_safe(failed) if failed is not None else None}


def tenant_safe(e: BaseException) -> str:
    """What a tenant may read of a box start failure: the quota module's own messages (written
    for them), the Docker engine's refusal as its class and HTTP status (its text names host
    paths, images, the daemon's socket), an OS error's text without its file names (host paths),
    else the error's type."""
    if isinstance(e, QuotaUnavailable):
        return str(e)
    try:  # imported here, where a start already failed; a jail-only host may lack the SDK
        import docker.errors
    except ImportError:
        docker = None
    if docker is not None and isinstance(e, docker.errors.APIError):
        status = f", HTTP {e.status_code}" if e.status_code else ""
        return f"the Docker engine refused to start the box ({type(e).__name__}{status}; {SEE_LOG})"
    if docker is not None and isinstance(e, docker.errors.DockerException):
        return f"the Docker client could not start the box ({type(e).__name__}; {SEE_LOG})"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return f"{type(e).__name__} ({SEE_LOG})"
