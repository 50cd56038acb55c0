"""The code interpreter's contexts (``/contexts``): E2B code contexts as execbox contexts in the
sandbox's session. Create checks the ``cwd`` is a directory there; restart and remove first stop
a cell running in the context (its request gets ``ContextRestarted`` / ``ContextRemoved``), then
end the old context's process in the box. A mixin of ``Interpreter`` (interpreter.py)."""

from __future__ import annotations

import asyncio
import logging
import posixpath
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response

from ...errors import InvalidConfigError, SessionNotFoundError
from ...providers.base import SandboxProvider
from . import envd_bg
from .cell_flow import CellHandle
from .registry import E2BSandbox
from .sandbox_http import clip, envd_error
from .workspace import HOME, PathRefused, to_e2b, to_workspace

if TYPE_CHECKING:  # pragma: no cover
    from ..container import Services

log = logging.getLogger("execbox.service.e2b")

LANGUAGES = {"python": "python", "py": "python", "javascript": "javascript", "js": "javascript",
             "typescript": None, "ts": None, "r": None, "java": None, "bash": "bash", "sh": "bash"}
MAX_CONTEXTS = 16
"""Code contexts one sandbox may hold (the defaults included): the agent keeps at most 16 live
context processes per box, all languages together (docs/e2b-compat.md)."""
MAX_CWD = 4096
STOP_WAIT = 10.0
"""Seconds restart/remove wait for a cell running in the context to stop once cancelled."""


@dataclass
class Ctx:
    id: str
    language: str
    cwd: str = HOME
    generation: int = 0
    executions: int = 0
    running: set[CellHandle] = field(default_factory=set, repr=False, compare=False)
    """Cells sent to this context that have not ended (restart and remove stop them)."""

    def execbox_id(self) -> str:
        return f"c{self.id[:40]}-{self.generation}"

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}


@dataclass
class Contexts:
    by_id: dict[str, Ctx] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def default(self, language: str) -> Ctx:
        with self.lock:
            return self.by_id.setdefault(f"default-{language}", Ctx(f"default-{language}", language))


def contexts_of(sb: E2BSandbox) -> Contexts:
    ctxs = getattr(sb, "_contexts", None)
    if ctxs is None:
        ctxs = Contexts()
        sb._contexts = ctxs  # type: ignore[attr-defined]
    return ctxs


def _language(value: Any) -> str:
    lang = LANGUAGES.get(str(value or "python").lower(), "")
    if not lang:
        raise ValueError(f"language {clip(value)!r} is not supported by execbox (python, javascript, bash)")
    return lang


def _cwd(value: Any) -> str:
    """A context's working directory: a workspace path (the one path validator), as E2B shows it."""
    if value is None or value == "":
        return HOME
    if not isinstance(value, str):
        raise ValueError("cwd must be a string")
    if len(value) > MAX_CWD:
        raise ValueError(f"cwd is longer than {MAX_CWD} characters")
    try:
        return to_e2b(to_workspace(value))
    except PathRefused as e:
        raise ValueError(f"cwd: {e}") from None


class ContextRoutes:
    """``Interpreter``'s context routes."""

    svc: Services

    async def create_context(self, sb: E2BSandbox, body: dict[str, Any]) -> Response:
        ctx = Ctx(secrets.token_hex(8), _language(body.get("language")), _cwd(body.get("cwd")))
        await asyncio.to_thread(self._check_dir, sb, to_workspace(ctx.cwd))
        ctxs = contexts_of(sb)
        with ctxs.lock:
            if len(ctxs.by_id) >= MAX_CONTEXTS:
                return envd_error(429, f"SB008: too many code contexts in this sandbox (max {MAX_CONTEXTS}); "
                                       f"remove one first")
            ctxs.by_id[ctx.id] = ctx
        return JSONResponse(ctx.to_json())

    def _check_dir(self, sb: E2BSandbox, rel: str) -> None:
        """ValueError (400) unless ``rel`` is a directory in the sandbox's workspace."""
        if rel == ".":
            return
        parent = posixpath.dirname(rel) or "."

        def call(provider: SandboxProvider, instance_id: str) -> list[Any]:
            return provider.list_files(instance_id, parent, False)

        missing = ValueError(f"cwd {clip(to_e2b(rel))!r} is not a directory in the sandbox; create it first")
        try:
            infos = self.svc.runs.file_op(sb.tenant_id, sb.session_id, "list_files", parent, sb.token_id, call)
        except InvalidConfigError as e:  # the parent is missing, or not a directory
            if isinstance(e, SessionNotFoundError):
                raise
            raise missing from None
        if not any(posixpath.normpath(i.path) == rel and i.is_dir for i in infos):
            raise missing

    async def context_op(self, sb: E2BSandbox, parts: list[str], method: str) -> Response:
        ctxs = contexts_of(sb)
        ctx = ctxs.by_id.get(parts[0]) if parts else None
        if ctx is None and parts and parts[0] in ("default-python", "default-javascript", "default-bash"):
            ctx = ctxs.default(parts[0].split("-", 1)[1])  # a default context not used yet
        if ctx is None:
            return envd_error(404, f"context {clip(parts[0] if parts else '')!r} not found")
        if len(parts) == 1 and method == "DELETE":
            with ctxs.lock:
                ctxs.by_id.pop(ctx.id, None)
            await self._stop_cells(ctx, "removed")
            self._end_context(sb, ctx.execbox_id())
            return Response(status_code=204)
        if parts[1:] == ["restart"] and method == "POST":
            old = ctx.execbox_id()
            ctx.generation += 1  # a fresh execbox context: empty globals
            ctx.executions = 0
            await self._stop_cells(ctx, "restarted")
            self._end_context(sb, old)
            return Response(status_code=204)
        return envd_error(404, "unknown context operation")

    @staticmethod
    async def _stop_cells(ctx: Ctx, why: str) -> None:
        """Cancel the cells running in ``ctx`` (as a kernel restart interrupts them) and wait, a
        bounded time, until they let go of the sandbox."""
        handles = ctx.running.copy()  # one C call under the GIL: safe beside a worker's discard
        if not handles:
            return
        for handle in handles:
            handle.stopped_by = why
            handle.cancel()
        deadline = time.monotonic() + STOP_WAIT

        def wait() -> None:
            for handle in handles:
                handle.done.wait(max(0.0, deadline - time.monotonic()))

        await asyncio.to_thread(wait)

    def _end_context(self, sb: E2BSandbox, execbox_id: str) -> None:
        """Free the old context's process in the box (in the background: a run may hold the box)."""
        def go() -> None:
            try:
                provider, instance_id = envd_bg.resolve_box(self.svc, sb)
                reset = getattr(provider, "reset_context", None)
                if reset is not None:
                    reset(instance_id, execbox_id)
            except Exception:  # noqa: BLE001 - the context ends with the box anyway
                log.debug("ending context %s failed", execbox_id, exc_info=True)

        threading.Thread(target=go, name="execbox-e2b-context-end", daemon=True).start()
