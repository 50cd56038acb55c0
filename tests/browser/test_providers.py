"""Providers page: cards from the admin API, a form generated from config_schema, server field
errors next to the field, Save, Test connection, Set active, fallback order, redacted secrets."""

from __future__ import annotations

from typing import Any

from tests.browser.conftest import RUNTIME, Server

SECRET = "sk-live-0123456789abcdefWXYZ"


def card(page: Any, provider: str) -> Any:
    return page.locator(f'article[data-provider="{provider}"]')


def field(page: Any, name: str) -> Any:
    return page.locator(f'#provider-editor [data-field="{name}"]')


def open_form(page: Any, provider: str) -> None:
    card(page, provider).get_by_role("button").click()
    page.locator("#editor-title").wait_for()


def test_cards_and_schema_generated_controls(signed_in: Any, server: Server, screenshot: Any) -> None:
    page = signed_in
    jail = card(page, "jail")
    jail.wait_for()
    assert "isolation: jail" in jail.inner_text()
    assert "Usable on this host" in jail.inner_text()
    with server.api() as api:
        config = api.get("/api/admin/sandbox/config").json()
    if config["active"] is None:  # nothing stored yet: the card of zero-config's pick says so
        picked = config["zero_config"]["provider"]
        assert page.locator(".badge.active").all_inner_texts() == ["active (zero-config)"]
        assert card(page, picked).locator(".badge.active").count() == 1
        assert f"zero-config uses {picked}" in page.locator(".lead").inner_text()
    e2b = card(page, "e2b")
    if e2b.count():  # installed but its module/SDK may be missing: the card says why in words
        assert "Not usable here:" in e2b.inner_text() or "Usable on this host" in e2b.inner_text()

    open_form(page, "jail")
    pids = field(page, "pids_limit").locator("input")
    assert pids.get_attribute("type") == "number"
    assert (pids.get_attribute("min"), pids.get_attribute("max")) == ("8", "32768")
    assert pids.input_value() == "128"  # schema default
    ast = field(page, "enable_ast_analysis").locator("input")
    assert ast.get_attribute("role") == "switch" and not ast.is_checked()
    assert "cgroup pids limit" in field(page, "pids_limit").locator(".help").inner_text()
    assert field(page, "pids_limit").locator("input").get_attribute("aria-describedby").count("help") == 1

    open_form(page, "self_managed")
    assert field(page, "endpoint").locator(".required").count() == 1
    assert field(page, "api_key").locator("input").get_attribute("type") == "password"
    assert field(page, "max_memory").locator("select").count() == 1
    assert field(page, "enable_seccomp").locator("input").is_checked()
    screenshot(page, "providers")


def test_validation_error_fixed_then_saved_tested_and_activated(signed_in: Any, server: Server,
                                                                screenshot: Any) -> None:
    page = signed_in
    open_form(page, "jail")
    field(page, "max_memory").locator("input").fill("8m")
    field(page, "pids_limit").locator("input").fill("16")
    page.get_by_role("button", name="Save", exact=True).click()
    error = field(page, "max_memory").locator(".field-error")
    error.wait_for()
    assert "must be at least 32m" in error.inner_text()
    assert field(page, "max_memory").locator("input").get_attribute("aria-invalid") == "true"
    assert page.locator("#provider-editor .notice.error").inner_text().startswith(
        "Not saved: fix the field marked below.")
    assert field(page, "pids_limit").locator(".field-error").inner_text() == ""
    screenshot(page, "providers-field-error")
    with server.api() as api:  # nothing was stored
        assert api.get("/api/admin/sandbox/config").json()["jail"]["max_memory"] == "512m"

    field(page, "max_memory").locator("input").fill("256m")
    field(page, "runtime").locator("input").fill(RUNTIME)
    field(page, "pool_size").locator("input").fill("1")
    page.get_by_role("button", name="Save", exact=True).click()
    page.get_by_text("Saved the Local jail (bubblewrap) configuration").wait_for()
    assert field(page, "max_memory").locator(".field-error").inner_text() == ""
    with server.api() as api:
        stored = api.get("/api/admin/sandbox/config").json()["jail"]
    assert (stored["max_memory"], stored["pids_limit"], stored["runtime"]) == ("256m", 16, RUNTIME)
    assert "configured" in card(page, "jail").inner_text()

    page.get_by_role("button", name="Test connection").click()
    probe = page.locator(".probe")
    probe.wait_for(timeout=90_000)
    text = probe.inner_text()
    assert "Connection OK" in text and "exit code 0" in text, text
    assert " ms · " in text
    assert "execbox-probe 42" in page.locator(".probe pre").first.inner_text()
    screenshot(page, "providers-test-connection")

    # switch the active provider to local and back to jail, through the buttons
    open_form(page, "local")
    page.get_by_role("button", name="Save", exact=True).click()
    page.get_by_text("Saved the").wait_for()
    page.get_by_role("button", name="Set active").click()
    page.get_by_text("is now the active provider.").wait_for()
    assert card(page, "local").locator(".badge.active").inner_text() == "active"
    assert card(page, "jail").locator(".badge.active").count() == 0
    with server.api() as api:
        assert api.get("/api/admin/sandbox/config").json()["active"] == "local"
    open_form(page, "jail")
    page.get_by_role("button", name="Set active").click()
    page.get_by_text("Local jail (bubblewrap) is now the active provider.").wait_for()
    assert card(page, "jail").locator(".badge.active").inner_text() == "active"
    assert page.get_by_role("button", name="Active", exact=True).is_disabled()
    with server.api() as api:
        assert api.get("/api/admin/sandbox/config").json()["active"] == "jail"


def test_set_active_on_unconfigured_provider_explains_why(signed_in: Any) -> None:
    page = signed_in
    open_form(page, "e2b")  # its stored (seed) configuration lacks the required api_key: 409
    page.get_by_role("button", name="Set active").click()
    alert = page.locator("#provider-editor .notice.error")
    alert.wait_for()
    text = alert.inner_text()
    assert "cannot be set active yet:" in text, text
    assert "api_key: is required" in text and "Save a valid configuration for it first. (SB002)" in text
    assert card(page, "e2b").locator(".badge.active").count() == 0


def test_fallback_order_saved(signed_in: Any, server: Server) -> None:
    page = signed_in
    fb = page.locator("#fallback")
    fb.get_by_role("combobox", name="Provider to add").select_option("local")
    fb.get_by_role("button", name="Add").click()
    fb.get_by_role("combobox", name="Provider to add").select_option("jail")
    fb.get_by_role("button", name="Add").click()
    fb.get_by_role("button", name="Move jail up").click()
    assert fb.locator(".fb-name").all_inner_texts() == ["jail", "local"]
    fb.get_by_role("button", name="Save fallback order").click()
    fb.get_by_text("Fallback order saved: jail → local.").wait_for()
    with server.api() as api:
        assert api.get("/api/admin/sandbox/fallback").json()["providers"] == ["jail", "local"]
    page.reload()
    page.locator("#fallback .fb-name").first.wait_for()
    assert page.locator("#fallback .fb-name").all_inner_texts() == ["jail", "local"]


def test_secret_is_only_ever_shown_redacted(signed_in: Any, server: Server) -> None:
    page = signed_in
    open_form(page, "self_managed")
    field(page, "endpoint").locator("input").fill("http://127.0.0.1:9")
    field(page, "api_key").locator("input").fill(SECRET)
    page.get_by_role("button", name="Save", exact=True).click()
    page.get_by_text("Saved the").wait_for()
    secret_input = field(page, "api_key").locator("input")
    assert secret_input.input_value() == "****WXYZ"  # the form now holds what the server returned
    assert SECRET not in page.content()
    assert SECRET not in page.evaluate("JSON.stringify({...localStorage, ...sessionStorage})")

    page.reload()
    open_form(page, "self_managed")
    assert field(page, "api_key").locator("input").input_value() == "****WXYZ"
    assert SECRET not in page.content()
    # saving again with the redacted value unchanged keeps the stored secret
    field(page, "max_retries").locator("input").fill("2")
    page.get_by_role("button", name="Save", exact=True).click()
    page.get_by_text("Saved the").wait_for()
    with server.api() as api:
        stored = api.get("/api/admin/sandbox/config").json()["self_managed"]
    assert (stored["api_key"], stored["max_retries"]) == ("****WXYZ", 2)
