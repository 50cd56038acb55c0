"""Pre-forked spare Python children in pooled Docker boxes: the first stateless run skips the fork.

Forking the preloaded agent is the slow part of a run under gVisor's ptrace platform (~150 ms);
a child forked ahead of time, empty and inside the same box, serves the next stateless run in a
few ms. Kept apart from the provider because only the pool's hot path needs it.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..boxes.docker_box import DockerBox
from ..errors import SandboxError
from ..models import ExecutionResult, Language
from .agent_backed import AgentBackedProvider
from .base import OutputCallback

log = logging.getLogger("execbox.provider.docker")

WARM_CONTEXT = "__execbox_warm__"
CONTEXT_KEYS = ("context_id", "context_new", "context_restarted", "context_reset", "context_note",
                "context_executions")


class DockerSparesMixin(AgentBackedProvider):
    _warmer: ThreadPoolExecutor | None
    _warm_lock: threading.Lock
    _warm_seq: int

    def _prewarm(self, box: DockerBox) -> None:
        """Spawn a fresh, unused Python context (a spare child) for the box's next stateless run.

        Forking the preloaded agent is the slow part of a run under gVisor's ptrace platform
        (~150 ms); a child forked ahead of time serves the run in a few ms. It is created empty
        inside this box, so it holds nothing but the preloaded modules, and serves one run only.
        """
        with self._warm_lock:
            self._warm_seq += 1
            cid = f"{WARM_CONTEXT}{self._warm_seq}"
        box.client.call("exec", {"language": "python", "code": "", "context_id": cid,
                                 "timeout": 60.0, "output_cap": 4096, "stream": False,
                                 "inline_artifacts": False}, timeout=90.0)
        box.warm_context = cid

    def _release_spare_later(self, box: DockerBox, used: str) -> None:
        """A session box keeps running after its first run: end the used spare in the background.

        Spares are not re-forked between session runs: measured under runsc, turning spares
        over on every run leaked sandbox memory until the box hit its cgroup limit."""
        def release() -> None:
            if box.destroyed or box.client.dead:
                return
            try:
                box.client.call("context.reset", {"context_id": used}, timeout=30.0)
            except Exception as e:  # noqa: BLE001 - the box is going away anyway
                log.debug("releasing the spare of %s failed: %s", box.name, e)

        warmer = self._warmer
        if warmer is not None:
            try:
                warmer.submit(release)
            except RuntimeError:  # shutting down
                pass

    def execute_code(self, instance_id: str, code: str, language: str, timeout: int = 10,
                     arguments: dict[str, Any] | None = None, *, context_id: str | None = None,
                     on_output: OutputCallback | None = None, inline_artifacts: bool = False) -> ExecutionResult:
        """The first stateless Python run of a pooled box uses its spare pre-forked child; every
        other run forks the agent as usual."""
        inst = self._instances.get(instance_id)
        box = inst.box if inst is not None and isinstance(inst.box, DockerBox) else None
        stateless_python = False
        if context_id is None and box is not None:
            try:
                stateless_python = Language.parse(language) is Language.PYTHON
            except SandboxError:
                pass
        warm = None
        if stateless_python and box is not None and box.warm_context:
            warm, box.warm_context = box.warm_context, None
        params = self._exec_params(code, language, arguments, warm or context_id)
        if warm is not None:  # a one-shot run in a spare context: a file python3 runs, not a notebook cell
            params["script"] = True
        try:
            result = self._exec(instance_id, params, timeout, on_output, inline_artifacts)
        finally:
            if warm is not None and box is not None and inst is not None and inst.session_id is not None:
                self._release_spare_later(box, warm)
        if warm is not None:
            for key in CONTEXT_KEYS:
                result.metadata.pop(key, None)
            result.metadata["warm_start"] = True
        return result
