"""Sessions page (list with tenant, provider, age, idle, executions; destroy) and Tokens page
(create shown once, list never whole, revoke takes effect at once)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.browser.conftest import Server


def test_sessions_listed_and_destroyed(signed_in: Any, server: Server, jail_active: None,
                                       screenshot: Any) -> None:
    with server.api() as api:
        for _ in range(2):
            r = api.post("/v1/sandbox/execute", json={"code": "print(1)", "tenant_id": "acme",
                                                      "session_id": "doomed"})
            assert r.status_code == 200, r.text
        api.post("/v1/sandbox/execute", json={"code": "print(2)", "tenant_id": "other", "session_id": "kept"})
    page = signed_in
    page.get_by_role("link", name="Sessions").click()
    row = page.locator('tr[data-session="acme/doomed"]')
    row.wait_for()
    cells = dict(zip(["tenant", "session", "provider", "age", "idle", "executions", "state", "lifecycle",
                      "owner", "expires"], row.locator("td").all_inner_texts(), strict=False))
    assert (cells["tenant"], cells["session"], cells["provider"], cells["executions"], cells["state"]) == (
        "acme", "doomed", "jail", "2", "idle")
    assert cells["lifecycle"] == "running" and cells["owner"] not in ("", "-")
    assert cells["expires"].startswith("14 min"), cells  # a running session's idle expiry: 15 min after its last use
    assert cells["age"].endswith(("ms", " s", "min"))
    screenshot(page, "sessions")

    page.fill("#sessions-tenant", "other")  # tenant filter
    page.get_by_role("button", name="Refresh").click()
    page.locator('tr[data-session="acme/doomed"]').wait_for(state="detached")
    assert page.locator('tr[data-session="other/kept"]').count() == 1
    page.fill("#sessions-tenant", "")
    page.get_by_role("button", name="Refresh").click()

    row.get_by_role("button", name="Destroy").click()
    row.get_by_role("button", name="Cancel").click()  # asked first; cancelling keeps it
    assert row.get_by_role("button", name="Destroy").is_visible()
    row.get_by_role("button", name="Destroy").click()
    row.get_by_role("button", name="Yes, destroy").click()
    page.get_by_text("Destroyed session acme/doomed: its box and workspace are gone.").wait_for()
    assert page.locator('tr[data-session="acme/doomed"]').count() == 0
    assert page.locator('tr[data-session="other/kept"]').count() == 1
    with server.api() as api:
        live = {(s["tenant_id"], s["session_id"]) for s in api.get("/v1/sandbox/sessions").json()["sessions"]}
    assert ("acme", "doomed") not in live and ("other", "kept") in live


def test_token_created_shown_once_listed_redacted_and_revoked(signed_in: Any, server: Server,
                                                              screenshot: Any) -> None:
    page = signed_in
    page.get_by_role("link", name="Tokens").click()
    page.get_by_role("button", name="Create token").click()  # tenant is required
    assert page.locator("#tok-tenant-error").inner_text() == "Enter the tenant this token acts for."
    page.fill("#tok-tenant", "bad tenant!")
    page.get_by_role("button", name="Create token").click()
    page.get_by_text("Tenant: invalid request: tenant_id").wait_for()

    page.fill("#tok-tenant", "globex")
    page.fill("#tok-name", "ci bot")
    page.get_by_role("button", name="Create token").click()
    secret = page.locator("#tok-secret").input_value()
    assert secret.startswith("ebx_") and len(secret) > 30
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {secret}"}) as c:
        assert c.get("/v1/sandbox/whoami").json()["tenant_id"] == "globex"
    row = page.locator("#tokens-table tr", has_text="ci bot")
    shown = row.locator("td[data-label=Token]").inner_text()
    assert shown == f"ebx_...{secret[-4:]}"  # the fixed tag and the last 4 only
    screenshot(page, "tokens-created")

    page.get_by_role("button", name="Done, hide it").click()
    assert secret not in page.content()
    page.reload()
    page.locator("#tokens-table tr", has_text="ci bot").wait_for()
    assert secret not in page.content()
    assert page.evaluate("localStorage.length") == 0
    own = page.locator(f'tr[data-token="{server.admin_id}"]')
    assert "signed in with this one" in own.inner_text() and own.get_by_role("button").count() == 0

    row = page.locator("#tokens-table tr", has_text="ci bot")
    row.get_by_role("button", name="Revoke").click()
    row.get_by_role("button", name="Yes, revoke").click()
    page.get_by_text("requests using it are refused from now on").wait_for()
    page.locator("#tokens-table tr", has_text="ci bot").wait_for(state="detached")  # active tokens only
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {secret}"}) as c:
        r = c.get("/v1/sandbox/whoami")
    assert r.status_code == 401 and r.json()["error"]["code"] == "SB002"
    page.get_by_label("Show revoked tokens").check()
    revoked = page.locator("#tokens-table tr", has_text="ci bot")
    revoked.wait_for()
    assert revoked.locator("td[data-label=Status]").inner_text() == "revoked"
    screenshot(page, "tokens")
