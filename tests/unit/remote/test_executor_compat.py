"""/run mapping, auth and runner errors, in process (real FastAPI app, real local provider)."""

from __future__ import annotations

import asyncio
import base64
import json
import signal

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from execbox.errors import CodeBlockedError, InstanceCreationError, ProviderUnavailableError
from execbox.models import ExecutionResult
from execbox.providers.local import LocalProvider
from execbox.providers.self_managed import STATUSES, run_response_to_result
from execbox.service.routes.executor_compat import (
    MAX_BODY_BYTES,
    MAX_JSON_DEPTH,
    ExecutorAuth,
    classify,
    create_executor_app,
    is_loopback,
    result_to_response,
)

LOOPBACK = "http://127.0.0.1"
"""TestClient's default Host, "testserver", is not one an open /run answers to."""


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def res(**kw) -> ExecutionResult:
    base = {"stdout": "", "stderr": "", "exit_code": 0, "execution_time": 0.01, "metadata": {}}
    base.update(kw)
    return ExecutionResult(**base)


@pytest.mark.parametrize("result, status, field, value", [
    (res(), "success", None, None),
    (res(exit_code=-9, timed_out=True, metadata={"error_code": "SB005"}), "resource_limit_exceeded",
     "resource_limit_type", "time"),
    (res(exit_code=-9, metadata={"error_code": "SB006", "signal": 9}), "resource_limit_exceeded",
     "resource_limit_type", "memory"),
    (res(truncated=True), "resource_limit_exceeded", "resource_limit_type", "output"),
    (res(exit_code=-31, metadata={"signal": signal.SIGSYS}), "unauthorized_access", "unauthorized_access_type",
     "disallowed_syscall"),
    (res(exit_code=-11, metadata={"signal": 11}), "runtime_error", "runtime_error_type", "signalled"),
    (res(exit_code=2, stderr="boom\n"), "program_error", "runtime_error_type", "nonzero_exit"),
    (res(exit_code=1, stderr="PermissionError: [Errno 13] Permission denied: '/x'\n"), "unauthorized_access",
     "unauthorized_access_type", "file_access"),
    (res(exit_code=1, stderr="OSError: [Errno 101] Network is unreachable\n"), "unauthorized_access",
     "unauthorized_access_type", "network_access"),
])
def test_classify_every_status(result, status, field, value):
    out = classify(result)
    assert out["status"] == status
    if field:
        assert out[field] == value
    assert set(out) == {"status", "resource_limit_type", "unauthorized_access_type", "runtime_error_type",
                        "detail"}


@pytest.mark.parametrize("stderr", ["MemoryError: cache budget exceeded\n", "MemoryError\n",
                                    "OSError: [Errno 12] Cannot allocate memory\n"])
def test_memory_limit_is_the_agents_verdict_not_stderr(stderr):
    """/run takes the agent's SB006 (agent/pump.looks_oom); it does not read stderr for a second rule."""
    assert classify(res(exit_code=1, stderr=stderr))["status"] == "program_error"
    out = classify(res(exit_code=1, stderr=stderr, metadata={"error_code": "SB006"}))
    assert (out["status"], out["resource_limit_type"]) == ("resource_limit_exceeded", "memory")


def test_response_round_trips_through_the_client_mapping():
    r = res(stdout="x\n", result={"a": [1]}, metadata={"result_present": True, "result_type": "dict",
                                                       "peak_memory_kb": 2048, "isolation": "jail"})
    body = result_to_response(r)
    back = run_response_to_result(body, provider="self_managed", instance_id="i", wall=0.02,
                                  default_isolation="container")
    assert back.result == {"a": [1]} and back.stdout == "x\n"
    assert back.metadata["peak_memory_kb"] == 2048.0 and back.metadata["isolation"] == "jail"


def test_client_maps_ragflow_executor_answers():
    """Bodies exactly as RAGFlow's executor_manager sends them (no isolation, no error object)."""
    common = {"stdout": "", "stderr": "", "detail": None, "time_used_ms": 5.0, "memory_used_kb": None,
              "resource_limit_type": None, "unauthorized_access_type": None, "runtime_error_type": None}
    kw = {"provider": "self_managed", "instance_id": "i", "wall": 0.1, "default_isolation": "container"}
    t = run_response_to_result({**common, "status": "resource_limit_exceeded", "exit_code": -124,
                                "stderr": "Execution timeout", "resource_limit_type": "time"}, **kw)
    assert t.timed_out and t.error_code == "SB005" and t.metadata["isolation"] == "container"
    m = run_response_to_result({**common, "status": "resource_limit_exceeded", "exit_code": -137,
                                "resource_limit_type": "memory"}, **kw)
    assert m.error_code == "SB006"
    u = run_response_to_result({**common, "status": "unauthorized_access", "exit_code": 1,
                                "unauthorized_access_type": "file_access"}, **kw)
    assert u.error_code == "SB007"
    ok = run_response_to_result({**common, "status": "success", "exit_code": 0, "stdout": "hi\n",
                                 "artifacts": [], "result": {"present": True, "value": 3, "type": "json"}}, **kw)
    assert ok.ok and ok.result == 3
    with pytest.raises(InstanceCreationError):
        run_response_to_result({**common, "status": "program_runner_error", "exit_code": -10,
                                "stderr": "Container pool is busy", "detail": "no_available_container"}, **kw)
    with pytest.raises(CodeBlockedError):
        run_response_to_result({**common, "status": "program_runner_error", "exit_code": -999,
                                "stderr": "Line 1: import os", "detail": "Code is unsafe"}, **kw)
    with pytest.raises(ProviderUnavailableError):
        run_response_to_result({**common, "status": "weird"}, **kw)
    assert len(STATUSES) == 6


@pytest.fixture(scope="module")
def local():
    p = LocalProvider()
    p.initialize({"enable_ast_analysis": True, "blocked_imports": ["socket"]})
    yield p
    p.shutdown()


def test_static_token_auth(local):
    app = create_executor_app(local, auth=ExecutorAuth(token="tok-123456"), owns_provider=False)
    c = TestClient(app)
    body = {"code_b64": b64("print(1)"), "language": "python"}
    r = c.post("/run", json=body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "SB002"
    assert r.headers["www-authenticate"] == "Bearer"
    assert c.post("/run", json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
    ok = c.post("/run", json=body, headers={"Authorization": "Bearer tok-123456"})
    assert ok.status_code == 200 and ok.json()["stdout"] == "1\n"


def test_bind_decides_openness():
    assert ExecutorAuth.for_bind("127.0.0.1").open is True
    assert ExecutorAuth.for_bind("::1").open is True
    assert ExecutorAuth.for_bind("0.0.0.0").open is False
    assert ExecutorAuth.for_bind("0.0.0.0", allow_unauthenticated=True).open is True
    assert ExecutorAuth.for_bind("127.0.0.1", token="t").open is False  # a token is always required once set
    assert is_loopback("localhost") and not is_loopback("10.0.0.1")


def test_blocked_code_is_a_runner_error_like_ragflow(local):
    c = TestClient(create_executor_app(local, owns_provider=False), base_url=LOOPBACK)
    r = c.post("/run", json={"code_b64": b64("import socket\n"), "language": "python"})
    assert r.status_code == 400
    body = r.json()
    assert body["status"] == "program_runner_error" and body["detail"] == "Code is unsafe"
    assert body["stderr"].startswith("Line 1:") and body["error"]["code"] == "SB007"


class Broken:
    def current(self):
        raise ProviderUnavailableError("every provider is down", details={"reasons": {}})

    def candidates(self):
        return []


def test_provider_unavailable_is_503_with_run_shape(local):
    app = create_executor_app(local, owns_provider=False)
    app.state.executor.providers = Broken()
    c = TestClient(app, base_url=LOOPBACK)
    r = c.post("/run", json={"code_b64": b64("print(1)")})
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "program_runner_error" and body["error"]["code"] == "SB009"
    assert body["exit_code"] == -999
    h = c.get("/healthz")
    assert h.status_code == 503 and h.json()["status"] == "unavailable"


def test_oversized_body_is_413(local):
    c = TestClient(create_executor_app(local, owns_provider=False), base_url=LOOPBACK)
    r = c.post("/run", content=b"{" + b" " * (33 * 1024 * 1024) + b"}", headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "SB002"


def test_inside_execbox_serve_run_needs_a_store_token(local, tmp_path):
    from execbox.service.app import create_app
    from execbox.service.config import ServiceSettings
    from execbox.service.routes.executor_compat import StaticProviders
    from execbox.service.store import open_store

    store = open_store(data_dir=str(tmp_path / "data"))
    _, token = store.tokens.create("tenant-x")
    app = create_app(store=store, providers=StaticProviders(local),
                     settings=ServiceSettings().with_(workspaces_dir=str(tmp_path / "ws")))
    with TestClient(app) as c:
        body = {"code_b64": b64("def main():\n    return 'served'\n"), "language": "python"}
        assert c.post("/run", json=body).status_code == 401
        r = c.post("/run", json=body, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and r.json()["result"]["value"] == "served"
        assert c.get("/healthz").json()["status"] == "ok"
        # it went through the service's execution path: counted like any other execution
        sample = app.state.services.metrics.registry.get_sample_value(
            "execbox_executions_total", {"provider": "local", "language": "python", "status": "success"})
        assert sample == 1.0
        art = c.post("/run", headers={"Authorization": f"Bearer {token}"}, json={
            "code_b64": b64("open('artifacts/o.txt', 'w').write('svc')\n"), "language": "python"})
        assert base64.b64decode(art.json()["artifacts"][0]["content_b64"]) == b"svc"


def test_cli_refuses_public_bind_without_token():
    from execbox.cli import app

    r = CliRunner().invoke(app, ["executor", "--host", "0.0.0.0", "--provider", "local"], env={})
    assert r.exit_code == 2
    assert "without authentication" in r.output


def test_cli_refuses_no_isolation_on_public_bind():
    from execbox.cli import app

    r = CliRunner().invoke(app, ["executor", "--host", "0.0.0.0", "--provider", "local", "--token", "t"], env={})
    assert r.exit_code == 2
    assert "no isolation" in r.output


# -- open mode: only programs, never web pages (CSRF / DNS rebinding) ----------------------------------

RUN = {"code_b64": b64("print('ran')"), "language": "python"}


def test_open_run_refuses_what_a_cross_site_page_can_send(local):
    c = TestClient(create_executor_app(local, owns_provider=False), base_url="http://127.0.0.1:9385")
    raw = json.dumps(RUN)
    # a "simple" cross-site request needs no preflight: text/plain, form types, or no type at all
    for ctype in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                  "multipart/form-data; boundary=x", None):
        r = c.post("/run", content=raw, headers={"content-type": ctype} if ctype else {})
        assert r.status_code == 415, (ctype, r.text)
        body = r.json()
        assert body["status"] == "program_runner_error" and body["error"]["code"] == "SB002"
        assert body["error"]["details"]["header"] == "Content-Type" and body["stdout"] == ""
    # a foreign Origin (another port is another origin; "null" is a sandboxed frame or file:)
    for origin in ("http://127.0.0.2:18733", "http://127.0.0.1:8080", "https://127.0.0.1:9385", "null",
                   "http://evil.example"):
        r = c.post("/run", json=RUN, headers={"Origin": origin})
        assert r.status_code == 403, (origin, r.text)
        assert r.json()["error"]["details"]["header"] == "Origin"
    # DNS rebinding: the page's own name resolves to us, so its requests are same-origin
    r = c.post("/run", json=RUN, headers={"Host": "evil.example:9385", "Origin": "http://evil.example:9385"})
    assert r.status_code == 400 and r.json()["error"]["details"]["header"] == "Host"
    assert c.post("/run", json=RUN, headers={"Host": "evil.example"}).status_code == 400
    # the preflight a JSON cross-site request needs is never granted
    pre = c.options("/run", headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
                                     "Access-Control-Request-Headers": "content-type"})
    assert pre.status_code >= 400 and "access-control-allow-origin" not in pre.headers
    # what programs send still runs: JSON, any allowed Host, no Origin or our own
    for headers in ({}, {"Host": "localhost:9385"}, {"Host": "[::1]:9385"},
                    {"Origin": "http://127.0.0.1:9385"}, {"content-type": "application/json; charset=utf-8"}):
        r = c.post("/run", content=raw, headers={"content-type": "application/json", **headers})
        assert r.status_code == 200 and r.json()["stdout"] == "ran\n", (headers, r.text)


def test_token_mode_keeps_serving_non_browser_clients(local):
    """With a token the request carries Authorization (a browser preflights that): no extra rules."""
    app = create_executor_app(local, auth=ExecutorAuth(token="tok-123456"), owns_provider=False)
    c = TestClient(app)  # Host: testserver
    r = c.post("/run", json=RUN, headers={"Authorization": "Bearer tok-123456"})
    assert r.status_code == 200 and r.json()["stdout"] == "ran\n"


def test_bind_decides_allowed_hosts():
    loop = ExecutorAuth.for_bind("127.0.0.1")
    assert loop.host_allowed("127.0.0.1:9385") and loop.host_allowed("localhost") and loop.host_allowed("[::1]:1")
    assert not loop.host_allowed("evil.example:9385") and not loop.host_allowed("10.0.0.5:9385")
    assert not loop.host_allowed("127.0.0.1.evil.example")
    private = ExecutorAuth.for_bind("10.0.0.5", allow_unauthenticated=True, allowed_hosts=["Executor"])
    assert private.host_allowed("10.0.0.5:9385") and private.host_allowed("executor:9385")
    assert not private.host_allowed("10.0.0.6") and not private.host_allowed("evil.example")
    wildcard = ExecutorAuth.for_bind("0.0.0.0", allow_unauthenticated=True)
    assert wildcard.host_allowed("10.0.0.6:9385") and wildcard.host_allowed("[fd00::1]:9385")
    assert not wildcard.host_allowed("sandbox-executor-manager:9385")  # names need --allowed-host


def test_cli_allowed_host_reaches_the_app(monkeypatch):
    import uvicorn

    from execbox.cli import app

    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda a, **kw: served.update(app=a, **kw))
    r = CliRunner().invoke(app, ["executor", "--provider", "local", "--allowed-host", "exec-a",
                                 "--allowed-host", "exec-b,exec-c"], env={})
    assert r.exit_code == 0, r.output
    auth = served["app"].state.executor.auth
    assert auth.open and {"exec-a", "exec-b", "exec-c", "127.0.0.1", "localhost"} <= auth.hosts
    served["app"].state.executor.providers.current().shutdown()


# -- bodies ---------------------------------------------------------------------------------------

def test_deeply_nested_json_is_422_json_invalid(local):
    c = TestClient(create_executor_app(local, owns_provider=False), base_url=LOOPBACK,
                   raise_server_exceptions=False)
    nested = '{"a":' * 990 + "1" + "}" * 990
    deep_args = json.dumps({"code_b64": b64("def main(**k):\n  return 1"), "arguments": "X"}).replace('"X"', nested)
    for raw in ("[" * 100_000 + "]" * 100_000, deep_args):
        r = c.post("/run", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text[:300]
        body = r.json()
        assert body["detail"][0]["type"] == "json_invalid" and body["error"]["code"] == "SB002"


def test_json_nested_past_the_depth_limit_is_422(local):
    """Parsable, but deep enough that validation, the provider or the echoed result could recurse."""
    c = TestClient(create_executor_app(local, owns_provider=False), base_url=LOOPBACK)
    code = b64("def main(**k):\n  return 1")
    for depth, status in ((MAX_JSON_DEPTH - 2, 200), (MAX_JSON_DEPTH + 5, 422)):
        nested = '{"a":' * depth + "1" + "}" * depth
        raw = json.dumps({"code_b64": code, "arguments": "X"}).replace('"X"', nested)
        r = c.post("/run", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == status, (depth, r.text[:300])
    assert r.json()["detail"][0]["type"] == "json_invalid"


class DeepResult(LocalProvider):
    """Answers every run with a result nested far past Python's recursion limit."""

    def execute_code(self, *args, **kwargs):
        value: object = 1
        for _ in range(5000):
            value = [value]
        return res(result=value, metadata={"result_present": True, "result_type": "list"})


def test_result_too_deep_to_encode_is_a_runner_error_not_a_500_traceback():
    p = DeepResult()
    p.initialize({})
    try:
        c = TestClient(create_executor_app(p, owns_provider=False), base_url=LOOPBACK,
                       raise_server_exceptions=False)
        r = c.post("/run", json={"code_b64": b64("print(1)")})
        assert r.status_code == 500, r.text[:300]
        body = r.json()
        assert body["status"] == "program_runner_error" and body["error"]["details"] == {"field": "result"}
        assert "could not be encoded" in body["error"]["message"]
    finally:
        p.shutdown()


def test_chunked_body_is_refused_while_streaming(local):
    """No Content-Length: the standalone app stops reading once the body passes the limit
    (before: it buffered the whole body, however large, then answered 413)."""
    app = create_executor_app(local, owns_provider=False)
    chunk = b"A" * (1 << 20)
    total = MAX_BODY_BYTES // len(chunk) * 4  # 128 MiB offered
    state = {"sent": 0}
    sent: list[dict] = []

    async def receive() -> dict:
        if state["sent"] == 0:
            state["sent"] += 1
            return {"type": "http.request", "body": b'{"code_b64":"', "more_body": True}
        if state["sent"] > total:
            return {"type": "http.disconnect"}
        state["sent"] += 1
        return {"type": "http.request", "body": chunk, "more_body": state["sent"] <= total}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/run", "raw_path": b"/run", "root_path": "", "query_string": b"",
             "headers": [(b"host", b"127.0.0.1:9385"), (b"content-type", b"application/json"),
                         (b"transfer-encoding", b"chunked")],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 9385)}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 413
    assert state["sent"] <= MAX_BODY_BYTES // len(chunk) + 2, f"read {state['sent']} MiB of {total}"
    body = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
    assert body["error"]["code"] == "SB002"


def test_serve_open_run_has_the_same_guards(local, tmp_path):
    """`execbox serve --open-run`: create_app with ExecutorAuth.for_bind(bind)."""
    from execbox.service.app import create_app
    from execbox.service.config import ServiceSettings
    from execbox.service.routes.executor_compat import StaticProviders
    from execbox.service.store import open_store

    app = create_app(store=open_store(data_dir=str(tmp_path / "data")), providers=StaticProviders(local),
                     settings=ServiceSettings().with_(workspaces_dir=str(tmp_path / "ws")),
                     executor_auth=ExecutorAuth.for_bind("127.0.0.1"))
    with TestClient(app, base_url="http://127.0.0.1:8080") as c:
        assert c.post("/run", content=json.dumps(RUN), headers={"content-type": "text/plain"}).status_code == 415
        assert c.post("/run", json=RUN, headers={"Origin": "http://127.0.0.2:18733"}).status_code == 403
        assert c.post("/run", json=RUN, headers={"Host": "rebound.example:8080"}).status_code == 400
        r = c.post("/run", json=RUN)
        assert r.status_code == 200 and r.json()["stdout"] == "ran\n"
