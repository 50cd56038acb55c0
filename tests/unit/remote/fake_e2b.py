"""A local fake of the HTTP APIs the E2B SDK speaks: the control plane (/v2/sandboxes), the code
interpreter's streaming /execute (NDJSON) and envd's /files. It runs submitted code for real
(python3 / node in a per-sandbox temp dir) so the provider is exercised end to end.

Not faked here: envd's Connect-RPC process API (``commands.run``); tests replace that at the SDK
boundary (see ``fake_commands_run``). Commands see the sandbox's own file system as a real E2B
VM does: bubblewrap binds the sandbox's home at /home/user and its own /tmp (see ``sandbox_argv``).
"""

from __future__ import annotations

import email.policy
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from email.parser import BytesParser
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

HOME = "/home/user"


@dataclass
class FakeSandbox:
    sandbox_id: str
    root: str
    tmp: str
    create_body: dict[str, Any]
    access_token: str
    killed: bool = False
    executions: int = 0


@dataclass
class FakeE2B:
    api_key: str = "e2b_test_key_0000000000000000000000000000abcd"
    sandboxes: dict[str, FakeSandbox] = field(default_factory=dict)
    extra_results: list[dict[str, Any]] = field(default_factory=list)  # appended to the next /execute
    executed: list[dict[str, Any]] = field(default_factory=list)
    uploaded: list[str] = field(default_factory=list)  # sandbox paths written through /files

    def cleanup(self) -> None:
        for sb in self.sandboxes.values():
            shutil.rmtree(sb.root, ignore_errors=True)
            shutil.rmtree(sb.tmp, ignore_errors=True)

    def map_path(self, sb: FakeSandbox, path: str) -> str | None:
        return map_sandbox_path({HOME: sb.root, "/tmp": sb.tmp}, path)


def map_sandbox_path(mounts: dict[str, str], path: str) -> str | None:
    """A sandbox path -> the host path behind it (None outside the sandbox's home and /tmp)."""
    for prefix, host in mounts.items():
        if path == prefix or path.startswith(prefix + "/"):
            root = os.path.realpath(host)
            real = os.path.realpath(root + path[len(prefix):])
            if real == root or real.startswith(root + os.sep):
                return real
    return None


def sandbox_argv(home: str, tmp: str, argv: list[str]) -> list[str]:
    """``argv`` seeing the fake sandbox's file system like a cloud VM: home at /home/user, own /tmp."""
    return ["bwrap", "--dev-bind", "/", "/", "--tmpfs", "/home", "--bind", home, HOME, "--bind", tmp, "/tmp",
            "--chdir", HOME, "--die-with-parent", "--", *argv]


def _timestamp() -> int:
    return time.time_ns()


def _run(sb: FakeSandbox, code: str, language: str) -> tuple[str, str, int]:
    argv = ["node", "-"] if language == "javascript" else [sys.executable, "-I", "-"]  # code on stdin
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": sb.root, "LANG": "C.UTF-8"}
    try:
        p = subprocess.run(argv, cwd=sb.root, env=env, capture_output=True, text=True, timeout=60,
                           input=code)
    except subprocess.TimeoutExpired as e:
        return e.stdout or "", e.stderr or "", -9
    return p.stdout, p.stderr, p.returncode


def _error_from(stderr: str, language: str, code: int) -> tuple[str, dict[str, Any] | None]:
    """Split a failed run's stderr into plain stderr and a Jupyter-style error message."""
    if language != "javascript" and "Traceback (most recent call last):" in stderr:
        head, _, tail = stderr.partition("Traceback (most recent call last):")
        trace = "Traceback (most recent call last):" + tail
        last = trace.strip().splitlines()[-1]
        name, _, value = last.partition(": ")
        return head, {"type": "error", "name": name, "value": value, "traceback": trace}
    if language != "javascript":  # no traceback: sys.exit(n), which IPython reports as SystemExit
        return stderr, {"type": "error", "name": "SystemExit", "value": str(code), "traceback": ""}
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else "Error"
    name, _, value = last.partition(": ")
    return "", {"type": "error", "name": name or "Error", "value": value, "traceback": stderr}


def create_fake_e2b_app(state: FakeE2B) -> FastAPI:
    app = FastAPI()

    def authorized(request: Request) -> bool:
        return request.headers.get("x-api-key") == state.api_key

    def sandbox_of(request: Request) -> FakeSandbox | None:
        sb = state.sandboxes.get(request.headers.get("e2b-sandbox-id", ""))
        if sb is None or sb.killed or request.headers.get("x-access-token") != sb.access_token:
            return None
        return sb

    @app.post("/v2/sandboxes")
    async def create(request: Request) -> Response:
        if not authorized(request):
            return JSONResponse({"code": 401, "message": "Invalid API key"}, status_code=401)
        body = await request.json()
        sid = "sbx" + uuid.uuid4().hex[:12]
        sb = FakeSandbox(sid, tempfile.mkdtemp(prefix="fake-e2b-"), tempfile.mkdtemp(prefix="fake-e2b-tmp-"),
                         body, "tok-" + uuid.uuid4().hex)
        state.sandboxes[sid] = sb
        return JSONResponse({"templateID": body.get("templateID"), "sandboxID": sid, "clientID": "fake",
                             "envdVersion": "0.5.7", "envdAccessToken": sb.access_token}, status_code=201)

    @app.get("/v2/sandboxes")
    async def list_sandboxes(request: Request) -> Response:
        if not authorized(request):
            return JSONResponse({"code": 401, "message": "Invalid API key"}, status_code=401)
        return JSONResponse([])

    @app.delete("/sandboxes/{sid}")
    async def kill(sid: str, request: Request) -> Response:
        if not authorized(request):
            return JSONResponse({"code": 401, "message": "Invalid API key"}, status_code=401)
        sb = state.sandboxes.get(sid)
        if sb is None or sb.killed:
            return JSONResponse({"code": 404, "message": "sandbox not found"}, status_code=404)
        sb.killed = True
        return Response(status_code=204)

    @app.post("/execute")
    async def execute(request: Request) -> Response:
        sb = sandbox_of(request)
        if sb is None:
            return JSONResponse({"message": "unknown sandbox"}, status_code=404)
        body = await request.json()
        language = body.get("language") or "python"
        state.executed.append(body)
        import asyncio

        stdout, stderr, code = await asyncio.to_thread(_run, sb, body["code"], language)
        sb.executions += 1
        messages: list[dict[str, Any]] = [{"type": "number_of_executions", "execution_count": sb.executions}]
        error = None
        if code != 0:
            stderr, error = _error_from(stderr, language, code)
        if stdout:
            messages.append({"type": "stdout", "text": stdout, "timestamp": _timestamp()})
        if stderr:
            messages.append({"type": "stderr", "text": stderr, "timestamp": _timestamp()})
        messages.extend(state.extra_results)
        state.extra_results.clear()
        if error:
            messages.append(error)
        messages.append({"type": "end_of_execution"})
        payload = "".join(json.dumps(m) + "\n" for m in messages)
        return StreamingResponse(iter([payload]), media_type="application/x-ndjson")

    @app.get("/files")
    async def read(request: Request, path: str) -> Response:
        sb = sandbox_of(request)
        if sb is None:
            return JSONResponse({"code": 401, "message": "unknown sandbox"}, status_code=401)
        real = state.map_path(sb, path)
        if real is None or not os.path.isfile(real):
            return JSONResponse({"code": 404, "message": f"file {path} not found"}, status_code=404)
        with open(real, "rb") as f:
            return Response(f.read(), media_type="application/octet-stream")

    @app.post("/files")
    async def write(request: Request, path: str | None = None) -> Response:
        sb = sandbox_of(request)
        if sb is None:
            return JSONResponse({"code": 401, "message": "unknown sandbox"}, status_code=401)
        body = await request.body()
        ctype = request.headers.get("content-type", "")
        if ctype.startswith("multipart/form-data"):  # envd's multipart upload: filename = path
            msg = BytesParser(policy=email.policy.default).parsebytes(
                f"Content-Type: {ctype}\r\n\r\n".encode() + body)
            uploads = [(path or part.get_filename(), part.get_payload(decode=True)) for part in msg.iter_parts()]
        else:
            uploads = [(path, body)]
        written = []
        for target, data in uploads:
            real = state.map_path(sb, target or "")
            if real is None:
                return JSONResponse({"code": 400, "message": "path outside the sandbox"}, status_code=400)
            os.makedirs(os.path.dirname(real), exist_ok=True)
            with open(real, "wb") as f:
                f.write(data)
            state.uploaded.append(target)
            written.append({"name": os.path.basename(target), "type": "file", "path": target})
        return JSONResponse(written)

    return app


def fake_commands_run(state: FakeE2B):
    """A replacement for the SDK's ``Commands.run`` (envd Connect-RPC): runs bash in the fake
    sandbox and answers with the SDK's own CommandResult / CommandExitException."""
    from e2b.sandbox.commands.command_handle import CommandExitException, CommandResult

    def run(self, cmd: str, background: bool = False, envs=None, user=None, cwd=None, on_stdout=None,
            on_stderr=None, stdin=None, timeout=60, request_timeout=None):
        sid = self._connection_config.sandbox_headers.get("E2b-Sandbox-Id")
        sb = state.sandboxes[sid]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": HOME, "LANG": "C.UTF-8", **(envs or {})}
        from e2b.exceptions import TimeoutException

        argv = sandbox_argv(sb.root, sb.tmp, ["bash", "-c", f"cd {shlex.quote(cwd or HOME)} && {cmd}"])
        try:
            p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutException("context deadline exceeded") from None
        if on_stdout and p.stdout:
            on_stdout(p.stdout)
        if on_stderr and p.stderr:
            on_stderr(p.stderr)
        if p.returncode != 0:
            raise CommandExitException(stdout=p.stdout, stderr=p.stderr, exit_code=p.returncode, error=None)
        return CommandResult(stdout=p.stdout, stderr=p.stderr, exit_code=0, error=None)

    return run
