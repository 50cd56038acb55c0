"""Bearer auth dependencies: 401 without/with a bad token, 403 for tenants on admin routes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from execbox.errors import SandboxError
from execbox.service.auth import Principal, require_admin, require_token
from execbox.service.container import services
from execbox.service.store import open_store


@pytest.fixture
def client(tmp_path):
    store = open_store(tmp_path)
    app = FastAPI()
    # the auth dependencies read the token store from the app's Services; only the store matters here
    app.dependency_overrides[services] = lambda: SimpleNamespace(store=store)

    @app.exception_handler(SandboxError)
    async def _err(_req, exc: SandboxError):
        return JSONResponse(exc.to_dict(), status_code=exc.http_status)

    @app.get("/me")
    def me(p: Principal = Depends(require_token)):
        return {"tenant": p.tenant_id, "role": p.role}

    @app.get("/admin")
    def admin(p: Principal = Depends(require_admin)):
        return {"ok": True}

    c = TestClient(app)
    c.store = store
    yield c
    store.close()


def test_missing_token_is_401_sb002(client):
    r = client.get("/me")
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "SB002"


def test_unknown_and_revoked_tokens_are_401_without_echoing_the_token(client):
    r = client.get("/me", headers={"Authorization": "Bearer ebx_nottherealtoken"})
    assert r.status_code == 401 and "nottherealtoken" not in r.text
    rec, tok = client.store.tokens.create("acme")
    assert client.get("/me", headers={"Authorization": f"Bearer {tok}"}).json() == {"tenant": "acme",
                                                                                 "role": "tenant"}
    client.store.tokens.revoke(rec.id)
    assert client.get("/me", headers={"Authorization": f"Bearer {tok}"}).status_code == 401


def test_tenant_token_on_admin_route_is_403(client):
    _, tenant = client.store.tokens.create("acme")
    _, admin = client.store.tokens.create("ops", "admin")
    r = client.get("/admin", headers={"Authorization": f"Bearer {tenant}"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "SB002"
    assert client.get("/admin", headers={"Authorization": f"bearer {admin}"}).json() == {"ok": True}
    assert client.get("/admin", headers={"Authorization": f"Basic {admin}"}).status_code == 401
