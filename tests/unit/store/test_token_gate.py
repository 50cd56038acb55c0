"""Review 47 F3: a token-authenticated route's token is checked before its body is read (the
token gate, service/token_gate.py), and admin bodies stop at 1 MiB.

The ASGI-level tests count the body bytes the app pulls from ``receive``: without the gate,
ForwardToOwner buffers every byte and FastAPI parses them before ``require_token`` runs."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from execbox.service.app import create_app
from execbox.service.config import ServiceSettings
from execbox.service.crypto import KeyRing, generate_key
from execbox.service.e2b_compat.control import router as e2b_router
from execbox.service.provider_manager import ProviderManager
from execbox.service.routes.executor_compat import ExecutorAuth
from execbox.service.store import open_store
from execbox.service.token_gate import scheme_for

MiB = 1024 * 1024


def _app(tmp_path, **kwargs: Any):  # noqa: ANN202, ANN001
    store = open_store(tmp_path)
    providers = ProviderManager(store, keyring=KeyRing(generate_key(), "test"), env={"SANDBOX_TYPE": "local"},
                                seed_file=None)
    app = create_app(store=store, providers=providers, settings=ServiceSettings(), **kwargs)
    return app, store, providers


@pytest.fixture
def served(tmp_path):  # noqa: ANN001, ANN201
    app, store, providers = _app(tmp_path)
    _, admin = store.tokens.create("ops", "admin")
    _, tenant = store.tokens.create("acme")
    with TestClient(app) as client:
        client.store, client.admin, client.tenant = store, admin, tenant
        yield client
    providers.shutdown()
    store.close()


def _post(app: Any, path: str, size: int, headers: dict[str, str]) -> tuple[int, int, dict[str, str]]:
    """POST ``size`` bytes (64 KiB chunks) straight to the ASGI app: (status, body bytes the app
    read, response headers)."""
    chunk = b"x" * 65536
    pulled = 0
    status = 0
    out_headers: dict[str, str] = {}

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        if pulled >= size:
            await asyncio.sleep(3600)  # the client is gone after its body: never answered
        part = chunk[:min(len(chunk), size - pulled)]
        pulled += len(part)
        return {"type": "http.request", "body": part, "more_body": pulled < size}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, out_headers
        if message["type"] == "http.response.start":
            status = message["status"]
            out_headers = {k.decode(): v.decode() for k, v in message.get("headers", [])}

    raw = [(b"host", b"testserver"), (b"content-type", b"application/json"),
           (b"content-length", str(size).encode()),
           *((k.lower().encode(), v.encode()) for k, v in headers.items())]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "headers": raw,
             "client": ("127.0.0.1", 1), "server": ("testserver", 80), "root_path": ""}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 60))
    return status, pulled, out_headers


@pytest.mark.parametrize("path", ["/v1/sandbox/write", "/write", "/sessions/acme/s1/processes",
                                  "/v1/sandbox/sessions/acme/s1/install", "/api/admin/sandbox/config",
                                  "/v2/sandboxes", "/sandboxes/abc/connect"])
def test_no_token_is_401_before_one_body_byte_is_read(tmp_path, path) -> None:  # noqa: ANN001
    app, store, providers = _app(tmp_path)
    try:
        status, pulled, headers = _post(app, path, 900 * 1024, {})
        assert (status, pulled) == (401, 0)
        assert headers.get("connection") == "close"  # the unread body leaves the connection unusable
        status, pulled, _ = _post(app, path, 900 * 1024, {"Authorization": "Bearer ebx_not-a-token"})
        assert (status, pulled) == (401, 0)
    finally:
        providers.shutdown()
        store.close()


def test_a_valid_token_still_gets_its_body_read(tmp_path) -> None:  # noqa: ANN001
    """The control for the test above: the counting sees a body that is read."""
    app, store, providers = _app(tmp_path)
    try:
        _, admin = store.tokens.create("ops", "admin")
        status, pulled, _ = _post(app, "/api/admin/tokens", 512 * 1024, {"Authorization": f"Bearer {admin}"})
        assert status == 400 and pulled == 512 * 1024  # not JSON: refused after reading it
    finally:
        providers.shutdown()
        store.close()


def test_admin_bodies_stop_at_1_mib_other_routes_do_not(served) -> None:  # noqa: ANN001
    auth = {"Authorization": f"Bearer {served.admin}", "content-type": "application/json"}
    r = served.post("/api/admin/tokens", content=b"{" + b" " * MiB + b"}", headers=auth)
    assert r.status_code == 413 and r.json()["error"]["code"] == "SB002"
    assert r.json()["error"]["message"] == "request body exceeds the limit of 1048576 bytes for /api/admin/* routes"
    assert r.json()["error"]["details"] == {"field": "body", "limit": MiB}
    r = served.post("/api/admin/tokens", content=json.dumps({"tenant_id": "acme"}).encode() + b" " * (MiB - 40),
                    headers=auth)
    assert r.status_code == 201, r.text
    r = served.post("/v1/sandbox/write", content=b"x" * (2 * MiB),  # the general limit (64 MiB) still applies
                    headers={"Authorization": f"Bearer {served.tenant}", "content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "body"


@pytest.mark.parametrize("path", ["/api/admin/tokens", "/v1/sandbox/execute", "/execute", "/sessions"])
def test_a_body_that_is_not_json_without_token_is_401_not_400(served, path) -> None:  # noqa: ANN001
    r = served.post(path, content=b"not json", headers={"content-type": "application/json"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "SB002", r.text
    assert r.json()["error"]["details"] == {"header": "Authorization"}


def test_roles_revocation_and_one_lookup_per_request(served, monkeypatch) -> None:  # noqa: ANN001
    r = served.post("/api/admin/tokens", json={"tenant_id": "x"}, headers={"Authorization": f"Bearer {served.tenant}"})
    assert r.status_code == 403  # the gate checks the token; the route still checks the role
    calls: list[str] = []
    real = served.store.tokens.verify
    monkeypatch.setattr(served.store.tokens, "verify", lambda t: calls.append(t) or real(t))
    assert served.get("/v1/sandbox/whoami", headers={"Authorization": f"Bearer {served.tenant}"}).status_code == 200
    assert calls == [served.tenant]  # the route reused the gate's check: still one query
    rec = served.store.tokens.verify(served.tenant)
    served.store.tokens.revoke(rec.id)
    r = served.post("/v1/sandbox/execute", content=b"{", headers={"Authorization": f"Bearer {served.tenant}"})
    assert r.status_code == 401 and r.json()["error"]["message"] == "invalid or revoked token"


def test_e2b_control_plane_is_gated_in_its_own_shape(served) -> None:  # noqa: ANN001
    r = served.post("/v2/sandboxes", content=b"not json")
    assert (r.status_code, r.json()) == (401, {"code": 401, "message": "invalid or missing API key (use an "
                                                                      "execbox token as E2B_API_KEY)"})
    r = served.post("/sandboxes", content=b"not json", headers={"X-API-Key": served.tenant})
    assert r.status_code == 400 and r.json()["message"] == "request body is not valid JSON"
    assert served.get("/sandboxes", headers={"Authorization": f"Bearer {served.tenant}"}).status_code == 200
    # a template id is stored with its sandbox: a NUL made PostgreSQL's insert fail (review 47 F2)
    r = served.post("/sandboxes", json={"templateID": "\x00team/base"}, headers={"X-API-Key": served.tenant})
    assert (r.status_code, r.json()["message"]) == (400, "templateID must not contain control characters")


def test_routes_with_their_own_auth_are_left_alone(served) -> None:  # noqa: ANN001
    assert served.get("/healthz").status_code == 200
    assert served.get("/openapi.json").status_code == 200
    assert served.get("/admin/").status_code == 200
    # the E2B sandbox URL: SandboxRouter answers with its own access tokens (an unknown sandbox: 502)
    r = served.post("/execute", content=b"{}", headers={"E2b-Sandbox-Id": "nosuchsandbox", "E2b-Sandbox-Port": "49999"})
    assert r.status_code == 502 and "was not found" in r.json()["message"]
    r = served.post("/mcp", content=b"{}", headers={"content-type": "application/json"})
    assert r.status_code == 401 and r.headers.get("www-authenticate") == 'Bearer realm="execbox"'  # MCP's own


def test_run_follows_its_executor_auth(tmp_path) -> None:  # noqa: ANN001
    app, store, providers = _app(tmp_path, executor_auth=ExecutorAuth(token="static-run-token"))
    try:
        status, pulled, headers = _post(app, "/run", 900 * 1024, {"Authorization": "Bearer wrong"})
        assert (status, pulled, headers.get("www-authenticate")) == (401, 0, "Bearer")
        status, pulled, _ = _post(app, "/run", 1024, {"Authorization": "Bearer static-run-token"})
        assert status != 401 and pulled == 1024
    finally:
        providers.shutdown()
        store.close()
    app, store, providers = _app(tmp_path / "open", executor_auth=ExecutorAuth(open=True))
    try:  # --open-run: no token at all, the body is /run's to judge
        status, pulled, _ = _post(app, "/run", 1024, {})
        assert status != 401 and pulled == 1024
    finally:
        providers.shutdown()
        store.close()


def test_every_token_route_is_gated(tmp_path) -> None:  # noqa: ANN001
    """A route added under a new path would be parsed before its token is checked: every route in
    the OpenAPI document but the health and metrics ones, and every E2B control route, is gated."""
    app, store, providers = _app(tmp_path)
    try:
        paths = set(app.openapi()["paths"])
    finally:
        providers.shutdown()
        store.close()
    public = {"/healthz", "/readyz", "/metrics"}
    assert public <= paths
    assert {p: scheme_for(p) for p in paths - public if scheme_for(p) is None} == {}
    assert scheme_for("/run") == "run" and all(scheme_for(p) is None for p in public | {"/mcp", "/admin/"})
    assert {r.path for r in e2b_router.routes if scheme_for(r.path) != "e2b"} == set()


@pytest.mark.parametrize(("path", "status"), [("/nonexistent", 404), ("/execute/", 307), ("/healthz", 405),
                                              ("/admin/x", 405), ("/openapi.json", 405)])
def test_paths_without_a_token_never_have_their_body_held(tmp_path, path, status) -> None:  # noqa: ANN001
    """ForwardToOwner buffered every body before the route ran, an unknown path's too: only token
    routes (checked by then) can be forwarded, so only their bodies are buffered."""
    app, store, providers = _app(tmp_path)
    try:
        assert _post(app, path, 8 * MiB, {})[:2] == (status, 0)
    finally:
        providers.shutdown()
        store.close()


@pytest.mark.parametrize("path, shape", [("/v1/sandbox/write", "execbox"), ("/v2/sandboxes", "e2b")])
def test_a_store_that_is_down_is_503_before_the_body_is_read(tmp_path, monkeypatch, path, shape) -> None:  # noqa: ANN001
    """Review 53 F2: the gate used to pass the request on when the store failed, so the body (up to
    64 MiB, no token checked) was read and parsed before the route's own check answered 503."""
    from sqlalchemy.exc import OperationalError

    app, store, providers = _app(tmp_path)

    def down(_token: str) -> None:
        raise OperationalError("SELECT", {}, Exception("connection refused"))

    monkeypatch.setattr(store.tokens, "verify", down)
    try:
        status, pulled, headers = _post(app, path, 900 * 1024, {"Authorization": "Bearer ebx_whatever"})
        assert (status, pulled) == (503, 0)
        assert headers.get("retry-after") == "1" and headers.get("connection") == "close"
    finally:
        providers.shutdown()
        store.close()
