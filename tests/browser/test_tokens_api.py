"""The admin token API behind the Tokens page (execbox.web.tokens_api), over real HTTP."""

from __future__ import annotations

import httpx

from tests.browser.conftest import Server


def test_plaintext_only_in_the_create_response(server: Server) -> None:
    with server.api() as api:
        r = api.post("/api/admin/tokens", json={"tenant_id": "initech", "name": "x"})
        assert r.status_code == 201
        made = r.json()
        secret = made["secret"]
        assert made["token"]["token"] == f"ebx_...{secret[-4:]}"  # the fixed tag and the last 4 only
        listing = api.get("/api/admin/tokens", params={"include_revoked": True})
        assert secret not in listing.text and secret[4:-4] not in listing.text
        mine = [t for t in listing.json()["tokens"] if t["current"]]
        assert [t["id"] for t in mine] == [server.admin_id]


def test_bad_input_and_unknown_ids_get_sb_errors(server: Server) -> None:
    with server.api() as api:
        bad = api.post("/api/admin/tokens", json={"tenant_id": "../etc", "role": "root"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "SB002"
        extra = api.post("/api/admin/tokens", json={"tenant_id": "a", "token_hash": "x"})
        assert extra.status_code == 400
        missing = api.delete("/api/admin/tokens/tok_0123456789abcdef")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "SB002"
        own = api.delete(f"/api/admin/tokens/{server.admin_id}")
        assert own.status_code == 409 and "signed in with" in own.json()["error"]["message"]
        assert api.get("/v1/sandbox/whoami").status_code == 200  # still valid


def test_tenant_tokens_and_anonymous_callers_are_refused(server: Server) -> None:
    with server.api() as api:
        tenant = api.post("/api/admin/tokens", json={"tenant_id": "initech"}).json()
    with server.api(tenant["secret"]) as as_tenant:
        r = as_tenant.post("/api/admin/tokens", json={"tenant_id": "initech", "role": "admin"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "SB002"
        assert as_tenant.get("/api/admin/tokens").status_code == 403
        assert as_tenant.delete(f"/api/admin/tokens/{server.admin_id}").status_code == 403
    assert httpx.get(f"{server.url}/api/admin/tokens").status_code == 401
