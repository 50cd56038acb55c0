"""A local fake of AgentRun for agentrun-sdk.

Data plane (plain httpx in the SDK; served here over real HTTP): sandbox create/get/delete,
``contexts/execute`` and ``filesystem`` upload/download. Code really runs (python3 / node, under
bubblewrap with a per-sandbox temp dir at /home/user and another at /tmp, as a cloud VM sees its
own file system).

Control plane (templates): the SDK talks to it through Alibaba's signed OpenAPI client over
HTTPS, so it is replaced at that boundary: ``FakeControlClient`` stands in for the generated
``alibabacloud_agentrun20250910`` client and answers with the SDK's own tea models.

Response shapes the SDK does not define (execute results, endOfExecution status values) follow
RAGFlow's parser of the real service; they are assumptions, listed in docs/remote-providers.md.
"""

from __future__ import annotations

import email.policy
import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from email.parser import BytesParser
from types import SimpleNamespace
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from .fake_e2b import map_sandbox_path, sandbox_argv

HOME = "/home/user"


@dataclass
class FakeAgentRun:
    access_key_id: str = "LTAI5tFAKEFAKEFAKE1234"
    access_key_secret: str = "fake-secret-value-9876"
    account_id: str = "1234567890123456"
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    sandboxes: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)  # (operation, detail)
    auth_headers_seen: list[dict[str, str]] = field(default_factory=list)

    def cleanup(self) -> None:
        for sb in self.sandboxes.values():
            shutil.rmtree(sb["root"], ignore_errors=True)
            shutil.rmtree(sb["tmp"], ignore_errors=True)

    def map_path(self, sb: dict[str, Any], path: str) -> str | None:
        return map_sandbox_path({HOME: sb["root"], "/tmp": sb["tmp"]}, path)


def _run(sb: dict[str, Any], code: str, language: str, timeout: float) -> tuple[str, str, int, bool]:
    argv = ["node", "-"] if language == "javascript" else ["python3", "-I", "-"]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": HOME, "LANG": "C.UTF-8"}
    try:
        p = subprocess.run(sandbox_argv(sb["root"], sb["tmp"], argv), env=env, input=code, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return out, "", -9, True
    return p.stdout, p.stderr, p.returncode, False


def create_fake_agentrun_app(state: FakeAgentRun) -> FastAPI:
    app = FastAPI()

    def signed(request: Request) -> bool:
        """The SDK signs every data-plane call with the AccessKey (RAM signature)."""
        headers = {k.lower(): v for k, v in request.headers.items()}
        state.auth_headers_seen.append(headers)
        return "agentrun-authorization" in headers and "x-acs-date" in headers

    def live(sid: str) -> dict[str, Any] | None:
        sb = state.sandboxes.get(sid)
        return sb if sb and not sb["deleted"] else None

    @app.post("/sandboxes")
    async def create(request: Request) -> Response:
        if not signed(request):
            return JSONResponse({"code": "Unauthorized", "message": "missing signature"}, status_code=401)
        body = await request.json()
        if body.get("templateName") not in state.templates:
            return JSONResponse({"code": "FAILED", "message": "template not found"})
        sid = "sbx-" + uuid.uuid4().hex[:10]
        state.sandboxes[sid] = {"root": tempfile.mkdtemp(prefix="fake-agentrun-"), "body": body, "deleted": False,
                                "tmp": tempfile.mkdtemp(prefix="fake-agentrun-tmp-")}
        state.calls.append(("create_sandbox", sid))
        return JSONResponse({"code": "SUCCESS", "data": {"sandboxId": sid, "templateName": body["templateName"],
                                                         "status": "READY"}})

    @app.get("/sandboxes/{sid}")
    async def get(sid: str, request: Request) -> Response:
        if not signed(request):
            return JSONResponse({"code": "Unauthorized"}, status_code=401)
        sb = live(sid)
        state.calls.append(("get_sandbox", sid))
        if sb is None:
            return JSONResponse({"code": "NotFound", "message": "sandbox not found"}, status_code=404)
        return JSONResponse({"code": "SUCCESS", "data": {"sandboxId": sid, "templateName": sb["body"]["templateName"],
                                                         "status": "READY"}})

    @app.delete("/sandboxes/{sid}")
    async def delete(sid: str, request: Request) -> Response:
        if not signed(request):
            return JSONResponse({"code": "Unauthorized"}, status_code=401)
        sb = live(sid)
        state.calls.append(("delete_sandbox", sid))
        if sb is None:
            return JSONResponse({"code": "FAILED", "message": "sandbox not found"})
        sb["deleted"] = True
        return JSONResponse({"code": "SUCCESS", "data": {"sandboxId": sid, "status": "TERMINATED"}})

    @app.post("/sandboxes/{sid}/contexts/execute")
    async def execute(sid: str, request: Request) -> Response:
        if not signed(request):
            return JSONResponse({"code": "Unauthorized"}, status_code=401)
        sb = live(sid)
        if sb is None:
            return JSONResponse({"code": "NotFound", "message": "sandbox not found"}, status_code=404)
        body = await request.json()
        state.calls.append(("execute", body.get("language", "")))
        import asyncio

        out, err, rc, timed_out = await asyncio.to_thread(_run, sb, body["code"],
                                                          body.get("language") or "python",
                                                          float(body.get("timeout") or 30))
        results: list[dict[str, Any]] = [{"type": "stdout", "text": line} for line in out.splitlines()]
        if rc != 0 and not timed_out:
            lines = [ln for ln in err.strip().splitlines() if ln.strip()]
            last = lines[-1] if lines else f"SystemExit: {rc}"
            name, _, value = last.partition(": ")
            results.append({"type": "error", "name": name, "value": value, "traceback": err})
        elif err:
            results.extend({"type": "stderr", "text": line} for line in err.splitlines())
        status = "timeout" if timed_out else ("error" if rc != 0 else "ok")
        results.append({"type": "endOfExecution", "status": status})
        return JSONResponse({"contextId": "ctx-" + sid, "results": results})

    @app.get("/sandboxes/{sid}/filesystem/download")
    async def download(sid: str, path: str, request: Request) -> Response:
        if not signed(request):
            return JSONResponse({"code": "Unauthorized"}, status_code=401)
        sb = live(sid)
        real = state.map_path(sb, path) if sb else None
        if real is None or not os.path.isfile(real):
            return JSONResponse({"code": "NotFound", "message": f"{path} not found"}, status_code=404)
        with open(real, "rb") as f:
            return Response(f.read(), media_type="application/octet-stream")

    @app.post("/sandboxes/{sid}/filesystem/upload")
    async def upload(sid: str, request: Request) -> Response:
        if not signed(request):
            return JSONResponse({"code": "Unauthorized"}, status_code=401)
        sb = live(sid)
        if sb is None:
            return JSONResponse({"code": "NotFound"}, status_code=404)
        ctype = request.headers.get("content-type", "")
        msg = BytesParser(policy=email.policy.default).parsebytes(
            f"Content-Type: {ctype}\r\n\r\n".encode() + await request.body())
        parts = {p.get_param("name", header="content-disposition"): p for p in msg.iter_parts()}
        target = parts["path"].get_content().strip()
        real = state.map_path(sb, target)
        if real is None:
            return JSONResponse({"code": "BadRequest", "message": "path outside the sandbox"}, status_code=400)
        os.makedirs(os.path.dirname(real), exist_ok=True)
        with open(real, "wb") as f:
            f.write(parts["file"].get_payload(decode=True))
        return JSONResponse({"path": target, "size": os.path.getsize(real)})

    return app


class FakeControlClient:
    """Stands in for alibabacloud_agentrun20250910's client (signed OpenAPI over HTTPS)."""

    def __init__(self, state: FakeAgentRun, credential: Any) -> None:
        self.state = state
        self.credential = credential  # the SDK-built alibabacloud_credentials client

    def _check_credentials(self) -> None:
        from alibabacloud_tea_openapi.exceptions._client import ClientException

        ak = self.credential.get_credential().access_key_id if self.credential is not None else None
        if ak != self.state.access_key_id:
            raise ClientException(status_code=403, code="InvalidAccessKeyId.NotFound",
                                  message="Specified access key is not found.")

    @staticmethod
    def _template_model(data: dict[str, Any]) -> Any:
        from alibabacloud_agentrun20250910.models import Template

        return Template().from_map(data)

    def get_template_with_options(self, template_name: str, headers: Any = None, runtime: Any = None) -> Any:
        from alibabacloud_tea_openapi.exceptions._client import ClientException

        self._check_credentials()
        self.state.calls.append(("get_template", template_name))
        t = self.state.templates.get(template_name)
        if t is None:
            raise ClientException(status_code=404, code="TemplateNotFound", message="template not found")
        return SimpleNamespace(body=SimpleNamespace(request_id="req-fake", data=self._template_model(t)))

    def create_template_with_options(self, request: Any, headers: Any = None, runtime: Any = None) -> Any:
        self._check_credentials()
        body = request.body.to_map()
        name = body["templateName"]
        self.state.calls.append(("create_template", name))
        self.state.templates[name] = {"templateName": name, "templateType": body.get("templateType"),
                                      "status": "READY", "templateId": "tpl-" + uuid.uuid4().hex[:8]}
        return SimpleNamespace(body=SimpleNamespace(request_id="req-fake",
                                                    data=self._template_model(self.state.templates[name])))


def install_fake_control_plane(state: FakeAgentRun, monkeypatch) -> None:
    """Route the SDK's control-plane client to FakeControlClient (the config is still built by the SDK)."""
    from agentrun.utils.control_api import ControlAPI

    real_get_client = ControlAPI._get_client

    def fake_get_client(self, config=None):
        real = real_get_client(self, config)  # the SDK builds its signed client as usual
        return FakeControlClient(state, real._credential)

    monkeypatch.setattr(ControlAPI, "_get_client", fake_get_client)
