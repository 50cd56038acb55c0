"""The code interpreter (port 49999): POST /execute streams NDJSON; /contexts manage contexts.

A run goes through the service's Executor (quota slot, session box, metrics, audit), exactly
like POST /v1/sandbox/execute. Python and JavaScript contexts are execbox contexts in the
sandbox's session (globals persist: a forked Python child, a long-lived Node process); restart
and remove end the old context's process in the box, and first stop a cell running in it.

A cell runs until it ends, or until its client goes away (the SDK's ``timeout`` closes the
stream): then it is cancelled (the agent kills it, and the context with it), so a cell the
caller gave up on never holds the sandbox.

A sandbox's cells take turns here, in the order they came (``Turns``, a kernel's queue), before
they ask the run service: a cell waiting its turn holds none of the tenant's execution slots
(the run service takes its slot before it waits for the session, which is the HTTP API's
contract). What is not the cell's code failing never comes back as the cell's error:

- refused before it ran (SB008 quota, SB009 / SB004 no box): the HTTP status of the error,
  before the 200 stream starts, so the SDK raises its own exception (429: ``SandboxException``
  "429 ..."; a sandbox gone: 502, ``TimeoutException``);
- once the stream started (a cell that waited its turn, a box that died under the cell, a cell
  the service cut off because the sandbox was killed or timed out): a line on stderr saying why,
  then the stream is broken off without its end, so the SDK raises (for a killed sandbox its own
  "The sandbox was killed while the request was in progress", as on E2B, whose stream dies with
  the sandbox).
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...errors import CodeBlockedError, OutOfMemoryError, SandboxError
from ...models import ExecutionResult, Language
from ...providers.agent_backed import AgentBackedProvider
from ...providers.base import OutputCallback, SandboxProvider
from ..executions import RunSpec
from .cell_flow import (
    BREAK,
    CUT_OFF,
    GO,
    QUIET_BROKEN,
    BrokenOff,
    CellHandle,
    CellStream,
    CutOff,
    Refused,
    Turns,
    refusal,
)
from .cells import display_result, error_from_stderr, js_cell, python_cell
from .code_contexts import ContextRoutes, Ctx, _language, contexts_of
from .registry import E2BSandbox
from .sandbox_http import TooLarge, clip, envd_error, read_json
from .workspace import to_workspace

log = logging.getLogger("execbox.service.e2b")

if TYPE_CHECKING:  # pragma: no cover
    from ..container import Services

EXEC_TIMEOUT = 300.0
CONTEXTS_LOST = ("execbox: this sandbox's box was started again before this cell (the old one died, or the "
                 "sandbox was paused or its server restarted): variables, imports and shell state of earlier "
                 "cells are gone; files are kept\n")
"""The stderr line of the first cell after that (``metadata.session.contexts_lost``): a bare
``NameError`` would read as a bug in the code (a kernel's restart is shown, too)."""
GONE_WAIT = 10.0
"""Seconds a cell cut off by its sandbox's kill waits for the sandbox to be gone before its stream
breaks (the SDK then asks ``is_running()``: it must say no)."""
CODE_ERRORS = (CodeBlockedError, OutOfMemoryError)
"""Service errors about the cell's code (the AST policy refused it; it took the box's memory):
the cell's error, as a kernel would report them, not a failure of the request."""


def _envs(value: Any) -> dict[str, str]:
    """A run's ``env_vars``: names to string values (what ``os.environ`` / ``process.env`` take)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\x00" not in k + v
        for k, v in value.items()
    ):
        raise ValueError("env_vars must map variable names to string values")
    return value


def _rel_cwd(ctx: Ctx) -> str | None:
    """The context's directory relative to the workspace (None: the workspace itself)."""
    rel = to_workspace(ctx.cwd)
    return None if rel == "." else rel


def _line(kind: str, **fields: Any) -> bytes:
    return (json.dumps({"type": kind, **fields}) + "\n").encode()


class Interpreter(ContextRoutes):
    def __init__(self, services: Services) -> None:
        self.svc = services
        self.turns = Turns()
        uvicorn_log = logging.getLogger("uvicorn.error")
        if QUIET_BROKEN not in uvicorn_log.filters:
            uvicorn_log.addFilter(QUIET_BROKEN)

    async def __call__(self, sb: E2BSandbox, request: Request) -> Response:
        path, method = request.url.path.rstrip("/") or "/", request.method
        limit = self.svc.settings.max_request_bytes
        try:
            if path == "/execute" and method == "POST":
                return await self.execute(sb, await read_json(request, limit))
            if path == "/contexts" and method == "POST":
                return await self.create_context(sb, await read_json(request, limit))
            if path == "/contexts" and method == "GET":
                return JSONResponse([c.to_json() for c in list(contexts_of(sb).by_id.values())])
            if path.startswith("/contexts/"):
                return await self.context_op(sb, path.split("/")[2:], method)
            if path == "/health":
                return Response(status_code=200)
        except TooLarge as e:
            return envd_error(413, str(e))
        except ValueError as e:
            return envd_error(400, str(e))
        return envd_error(404, f"no route {method} {clip(path)} on the code interpreter")

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
        envs = _envs(body.get("env_vars"))
        settings = self.svc.settings
        try:
            size = len(code.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError("code is not valid UTF-8 text (it holds a lone UTF-16 surrogate)") from None
        if size > settings.max_code_bytes:
            return envd_error(413, f"code is larger than {settings.max_code_bytes} bytes")
        return await self._execute(sb, ctx, code, envs)

    async def _execute(self, sb: E2BSandbox, ctx: Ctx, code: str, envs: dict[str, str]) -> Response:
        """Start the cell on a worker thread; answer once it reached its box or waits its turn
        (the 200 stream), or was refused before it ran (that error's status)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        handle = CellHandle()
        ctx.running.add(handle)
        streaming = False
        lock = threading.Lock()

        def push(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is closed: the server is stopping
                handle.cancel()

        def go() -> None:
            nonlocal streaming
            with lock:  # output callbacks may come from another thread
                if streaming:
                    return
                streaming = True
            push(GO)

        def out(item: Any) -> None:
            go()
            push(item)

        def on_output(stream: str, text: str) -> None:
            if stream in ("stdout", "stderr") and text:
                out(_line(stream, text=text, timestamp=time.time_ns() // 1000))

        def broken(why: str) -> None:
            """The request failed, not the code: say why on stderr, then break the stream off."""
            log.info("e2b sandbox %s: a cell's stream is broken off: %s", sb.sandbox_id, why)
            on_output("stderr", f"execbox: {why}; this request ends without a result\n")
            push(BREAK)

        def work() -> None:
            handle.on_start = go
            took = False
            try:
                took = self.turns.take(sb.sandbox_id, handle, go, lambda: self._alive(sb))
                if not took:
                    if handle.stopped_by:
                        out(_stopped_line(handle))
                    elif not handle.cancelled.is_set():  # the sandbox went while the cell waited
                        broken("the sandbox was killed or timed out before this cell ran")
                    return
                for line in self._run(sb, ctx, code, envs, on_output, handle):
                    out(line)
            except CutOff as e:
                if e.reason == "destroyed":
                    self._wait_gone(sb)
                broken(CUT_OFF.get(e.reason, f"this cell was stopped ({e.reason})"))
            except SandboxError as e:
                if isinstance(e, CODE_ERRORS) and handle.reached_box:  # about the code: its error
                    out(_line("error", name=type(e).__name__, value=f"{e.code}: {e.message}", traceback=""))
                elif handle.reached_box or streaming:
                    what = "this cell was cut short" if handle.reached_box else "this cell did not run"
                    broken(f"{what}: {e.code}: {e.message}")
                else:
                    push(Refused(refusal(sb, e)))
            except Exception as e:  # noqa: BLE001 - reported to the client, the server stays up
                if handle.cancelled.is_set():
                    out(_stopped_line(handle))
                else:
                    log.exception("e2b sandbox %s: a cell failed unexpectedly", sb.sandbox_id)
                    broken(f"the cell could not be run ({type(e).__name__})")
            finally:
                if took:
                    self.turns.release(sb.sandbox_id, handle)
                ctx.running.discard(handle)
                handle.done.set()
                push(None)

        # on the request's context: what the request set there (sessions.notes) holds for the run
        threading.Thread(target=contextvars.copy_context().run, args=(work,), name="execbox-e2b-execute",
                         daemon=True).start()
        try:
            first = await queue.get()
        except BaseException:  # the server stops (the request is cancelled): so does the cell
            handle.cancel()
            raise
        if isinstance(first, Refused):
            return first.response
        return CellStream(self._relay(queue, handle), media_type="application/x-ndjson")

    @staticmethod
    async def _relay(queue: asyncio.Queue[Any], handle: CellHandle) -> AsyncIterator[bytes]:
        finished = False
        try:
            while True:
                item = await queue.get()
                if item is None:
                    finished = True
                    return
                if item is BREAK:
                    finished = True
                    raise BrokenOff
                if item is not GO:
                    yield item
        finally:
            if not finished:  # the client went away (the SDK's timeout): stop the cell
                handle.cancel()

    def _alive(self, sb: E2BSandbox) -> bool:
        """Whether the sandbox still exists (not killed, not timed out); yes when that cannot be told."""
        registry = getattr(self.svc, "e2b", None)
        if registry is None:
            return True
        try:
            return registry.get(sb.sandbox_id) is not None
        except Exception:  # noqa: BLE001 - the run service's own checks decide then
            log.debug("looking up e2b sandbox %s failed", sb.sandbox_id, exc_info=True)
            return True

    def _wait_gone(self, sb: E2BSandbox) -> None:
        """Until the sandbox whose kill cut a cell off is gone (GONE_WAIT at most): the kill
        destroys the session first (which stops the cell) and forgets the sandbox after."""
        registry = getattr(self.svc, "e2b", None)
        deadline = time.monotonic() + GONE_WAIT
        while registry is not None and time.monotonic() < deadline:
            try:
                if registry.get(sb.sandbox_id, fresh=True) is None:
                    return
            except Exception:  # noqa: BLE001 - then it cannot be told: break the stream all the same
                return
            time.sleep(0.02)

    def _run(self, sb: E2BSandbox, ctx: Ctx, code: str, envs: dict[str, str], on_output: OutputCallback,
             handle: CellHandle) -> list[bytes]:
        language = ctx.language
        cwd = _rel_cwd(ctx)
        # E2B starts kernels with the sandbox's envs (a context's first cell sets them); the run's
        # envs hold for the cell. A bash context starts with the sandbox's; a provider without
        # bash contexts runs each bash cell as a process of its own: both, the run's on top.
        if language == "python":
            program = python_cell(code, envs, cwd, start_env=sb.env_vars)
        elif language == "javascript":
            program = js_cell(code, envs, cwd, start_env=sb.env_vars)
        else:
            program = code
        context_id = ctx.execbox_id() if language in ("python", "javascript") else None
        cap: list[int] = []

        def call(provider: SandboxProvider, instance_id: str, one_shot: bool,
                 out: OutputCallback | None) -> ExecutionResult:
            cap.append(int(getattr(provider, "output_cap", 0) or 0))
            if language == "bash" and isinstance(provider, AgentBackedProvider):
                return provider.run_command(instance_id, program, EXEC_TIMEOUT, cwd=cwd, env=envs, on_output=out,
                                            context_id=ctx.execbox_id(), start_env=sb.env_vars)
            if language == "bash":
                return provider.run_command(instance_id, program, EXEC_TIMEOUT, cwd=cwd,
                                            env={**sb.env_vars, **envs} or None, on_output=out)
            # enable_ast_analysis judges the user's code, not the cell driver around it
            provider.check_code_policy(code, Language.parse(language))
            kwargs: dict[str, Any] = {"on_output": out}
            if context_id is not None:
                kwargs["context_id"] = context_id
            return provider.execute_code(instance_id, program, Language.parse(language).value, EXEC_TIMEOUT,
                                         None, **kwargs)

        spec = RunSpec(sb.tenant_id, sb.session_id, "execute_code", language, code, sb.token_id, call)
        try:
            result = self.svc.runs.run(spec, on_output, handle)
        except SandboxError as e:
            if spec.cancelled_reason and not isinstance(e, CODE_ERRORS):
                raise CutOff(spec.cancelled_reason) from e  # the box went with the sandbox
            raise
        reason = result.metadata.get("cancelled_reason") if result.metadata.get("cancelled") else None
        if reason:  # the service stopped it (a kill, the expiry, a drain): no error of the code's
            raise CutOff(str(reason))
        if not handle.stopped_by:  # a cell its restart stopped does not count in the new kernel
            ctx.executions += 1
        lines: list[bytes] = []
        note = _truncation_note(result, cap[0] if cap else 0)
        if note:
            on_output("stderr", note)
        if (result.metadata.get("session") or {}).get("contexts_lost"):  # said once, by this cell
            on_output("stderr", CONTEXTS_LOST)
        lines.extend(self._figures(sb, result))
        main = display_result(result.result)
        if main is not None:
            lines.append(_line(main.pop("type"), **main))
        if handle.stopped_by:
            lines.append(_stopped_line(handle))
        elif result.timed_out:
            lines.append(_line("error", name="TimeoutError", value="execution timed out", traceback=""))
        elif result.exit_code != 0 or result.error_code:
            # the agent's own error (the cell's exception, as the driver or the runner reported
            # it); read back from stderr only where the run has none (error_from_stderr says when)
            error = dict(result.error) if result.error else error_from_stderr(result.stderr, language)
            if language == "bash":  # a shell says little on its own: the status, and whether it ended
                error["value"] = (f"{error['value']} (exit code {result.exit_code})" if result.stderr.strip()
                                  else f"exit code {result.exit_code}")
                if result.metadata.get("context_reset"):
                    error["value"] += "; the shell ended, the next cell starts a fresh one"
            lines.append(_line("error", **error))
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


def _stopped_line(handle: CellHandle) -> bytes:
    if handle.stopped_by is None:
        return _line("error", name="Cancelled", value="the cell was cancelled", traceback="")
    return _line("error", name=f"Context{handle.stopped_by.capitalize()}", traceback="",
                 value=f"the code context was {handle.stopped_by} while this cell ran; the cell was stopped")


def _truncation_note(result: ExecutionResult, cap: int) -> str:
    """The stderr line saying which stream hit the output cap (the HTTP API's ``truncated``)."""
    if not result.truncated:
        return ""
    if not cap:
        return "execbox: output exceeded the cap and was truncated\n"
    cut = [name for name, text in (("stdout", result.stdout), ("stderr", result.stderr))
           if len(text.encode("utf-8", "replace")) >= cap - 3]  # a split character is cut at the cap
    if not cut:
        return ""  # the value main() returned was over the cap: the agent's own line says so
    return (f"execbox: output exceeded the cap and was truncated: {' and '.join(cut)} kept "
            f"the first {cap} bytes\n")
