"""The code interpreter (port 49999): POST /execute streams NDJSON; /contexts manage contexts.

A run goes through the service's Executor (quota slot, session box, metrics, audit), exactly
like POST /v1/sandbox/execute. Python and JavaScript contexts are execbox contexts in the
sandbox's session (globals persist: a forked Python child, a long-lived Node process); restart
and remove end the old context's process in the box.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ...errors import SandboxError
from ...models import ExecutionResult, Language
from ...providers.base import OutputCallback, SandboxProvider
from ..executions import RunSpec
from . import envd_bg
from .cells import display_result, error_from_stderr, python_cell
from .registry import E2BSandbox
from .sandbox_http import TooLarge, clip, envd_error, read_json
from .workspace import HOME, PathRefused, to_e2b, to_workspace

log = logging.getLogger("execbox.service.e2b")

if TYPE_CHECKING:  # pragma: no cover
    from ..container import Services

LANGUAGES = {"python": "python", "py": "python", "javascript": "javascript", "js": "javascript",
             "typescript": None, "ts": None, "r": None, "java": None, "bash": "bash", "sh": "bash"}
EXEC_TIMEOUT = 300.0
MAX_CONTEXTS = 16
"""Code contexts one sandbox may hold (the defaults included): the agent keeps at most 16 live
context processes per box, both languages together (docs/e2b-compat.md)."""
MAX_CWD = 4096


@dataclass
class Ctx:
    id: str
    language: str
    cwd: str = HOME
    generation: int = 0
    executions: int = 0

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


def _line(kind: str, **fields: Any) -> bytes:
    return (json.dumps({"type": kind, **fields}) + "\n").encode()


class Interpreter:
    def __init__(self, services: Services) -> None:
        self.svc = services

    async def __call__(self, sb: E2BSandbox, request: Request) -> Response:
        path, method = request.url.path.rstrip("/") or "/", request.method
        limit = self.svc.settings.max_request_bytes
        try:
            if path == "/execute" and method == "POST":
                return await self.execute(sb, await read_json(request, limit))
            if path == "/contexts" and method == "POST":
                return self.create_context(sb, await read_json(request, limit))
            if path == "/contexts" and method == "GET":
                return JSONResponse([c.to_json() for c in list(contexts_of(sb).by_id.values())])
            if path.startswith("/contexts/"):
                return self.context_op(sb, path.split("/")[2:], method)
            if path == "/health":
                return Response(status_code=200)
        except TooLarge as e:
            return envd_error(413, str(e))
        except ValueError as e:
            return envd_error(400, str(e))
        return envd_error(404, f"no route {method} {clip(path)} on the code interpreter")

    def create_context(self, sb: E2BSandbox, body: dict[str, Any]) -> Response:
        ctx = Ctx(secrets.token_hex(8), _language(body.get("language")), _cwd(body.get("cwd")))
        ctxs = contexts_of(sb)
        with ctxs.lock:
            if len(ctxs.by_id) >= MAX_CONTEXTS:
                return envd_error(429, f"SB008: too many code contexts in this sandbox (max {MAX_CONTEXTS}); "
                                       f"remove one first")
            ctxs.by_id[ctx.id] = ctx
        return JSONResponse(ctx.to_json())

    def context_op(self, sb: E2BSandbox, parts: list[str], method: str) -> Response:
        ctxs = contexts_of(sb)
        ctx = ctxs.by_id.get(parts[0]) if parts else None
        if ctx is None:
            return envd_error(404, f"context {clip(parts[0] if parts else '')!r} not found")
        if len(parts) == 1 and method == "DELETE":
            with ctxs.lock:
                ctxs.by_id.pop(ctx.id, None)
            self._end_context(sb, ctx.execbox_id())
            return Response(status_code=204)
        if parts[1:] == ["restart"] and method == "POST":
            old = ctx.execbox_id()
            ctx.generation += 1  # a fresh execbox context: empty globals
            ctx.executions = 0
            self._end_context(sb, old)
            return Response(status_code=204)
        return envd_error(404, "unknown context operation")

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

    async def execute(self, sb: E2BSandbox, body: dict[str, Any]) -> Response:
        code = body.get("code")
        if not isinstance(code, str):
            raise ValueError("code must be a string")
        ctx_id = body.get("context_id")
        if ctx_id:
            ctx = contexts_of(sb).by_id.get(str(ctx_id))
            if ctx is None:
                return envd_error(404, f"context {clip(ctx_id)!r} not found")
            if body.get("language") and _language(body["language"]) != ctx.language:
                raise ValueError("language does not match the context's language")
        else:
            ctx = contexts_of(sb).default(_language(body.get("language")))
        settings = self.svc.settings
        try:
            size = len(code.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError("code is not valid UTF-8 text (it holds a lone UTF-16 surrogate)") from None
        if size > settings.max_code_bytes:
            return envd_error(413, f"code is larger than {settings.max_code_bytes} bytes")
        return StreamingResponse(self._stream(sb, ctx, code), media_type="application/x-ndjson")

    async def _stream(self, sb: E2BSandbox, ctx: Ctx, code: str):  # noqa: ANN202
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        def push(item: bytes | None) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def on_output(stream: str, text: str) -> None:
            if stream in ("stdout", "stderr") and text:
                push(_line(stream, text=text, timestamp=time.time_ns() // 1000))

        def work() -> None:
            try:
                for line in self._run(sb, ctx, code, on_output):
                    push(line)
            except SandboxError as e:
                push(_line("error", name=type(e).__name__, value=f"{e.code}: {e.message}", traceback=""))
            except Exception as e:  # noqa: BLE001 - reported to the client, the server stays up
                push(_line("error", name=type(e).__name__, value=str(e), traceback=""))
            finally:
                push(None)

        threading.Thread(target=work, name="execbox-e2b-execute", daemon=True).start()
        while True:
            item = await queue.get()
            if item is None:
                return
            yield item

    def _run(self, sb: E2BSandbox, ctx: Ctx, code: str, on_output: OutputCallback) -> list[bytes]:
        language = ctx.language
        program = python_cell(code) if language == "python" else code
        context_id = ctx.execbox_id() if language in ("python", "javascript") else None

        def call(provider: SandboxProvider, instance_id: str, one_shot: bool,
                 out: OutputCallback | None) -> ExecutionResult:
            if language == "bash":
                return provider.run_command(instance_id, program, EXEC_TIMEOUT, env=sb.env_vars or None,
                                            on_output=out)
            kwargs: dict[str, Any] = {"on_output": out}
            if context_id is not None:
                kwargs["context_id"] = context_id
            return provider.execute_code(instance_id, program, Language.parse(language).value, EXEC_TIMEOUT,
                                         None, **kwargs)

        spec = RunSpec(sb.tenant_id, sb.session_id, "execute_code", language, code, sb.token_id, call)
        result = self.svc.runs.run(spec, on_output)
        ctx.executions += 1
        lines: list[bytes] = []
        lines.extend(self._figures(sb, result))
        main = display_result(result.result)
        if main is not None:
            lines.append(_line(main.pop("type"), **main))
        if result.timed_out:
            lines.append(_line("error", name="TimeoutError", value="execution timed out", traceback=""))
        elif result.exit_code != 0 or result.error_code:
            lines.append(_line("error", **error_from_stderr(result.stderr, language)))
        lines.append(_line("number_of_executions", execution_count=ctx.executions))
        lines.append(_line("end_of_execution"))
        return lines

    def _figures(self, sb: E2BSandbox, result: ExecutionResult) -> list[bytes]:
        images = [a for a in result.artifacts if a.mime_type in ("image/png", "image/jpeg", "image/svg+xml")]
        if not images:
            return []
        out = []
        with self.svc.sessions.session(sb.tenant_id, sb.session_id) as s:
            for art in images:
                data = s.provider.read_bytes(s.instance_id, art.path or art.name)
                key = {"image/png": "png", "image/jpeg": "jpeg"}.get(art.mime_type, "svg")
                value = data.decode("utf-8", "replace") if key == "svg" else base64.b64encode(data).decode()
                out.append(_line("result", **{key: value}, text=f"<Figure {art.name}>", is_main_result=False))
        return out

