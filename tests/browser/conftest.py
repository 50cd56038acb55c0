"""Browser tests: a real `execbox serve` subprocess on a loopback port (temp data dir, jail
provider) driven by Debian's Chromium through Playwright.

Playwright never downloads a browser here: scripts/setup/test/50-browser.sh installs the
`chromium` package and the tests launch /usr/bin/chromium via executable_path, with a fresh
temporary profile per launch. Screenshots land in test-artifacts/browser/ (git-ignored).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import require
from tests.serve_process import RUNTIME, require_jail_runtime, serve

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WIDTHS = {"desktop": (1280, 900), "mobile": (390, 844)}
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"


@dataclass
class Server:
    url: str
    admin_token: str
    admin_id: str
    data_dir: str
    log: Path

    def api(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120,
                            headers={"Authorization": f"Bearer {token or self.admin_token}"})


@pytest.fixture(scope="session")
def jail_ready() -> None:
    require_jail_runtime(RUNTIME)


@pytest.fixture(scope="session")
def server(jail_ready: None) -> Iterator[Server]:
    """`python -m execbox serve` with its own data dir and a pre-made admin token."""
    from execbox.service.store import open_store

    data_dir = tempfile.mkdtemp(prefix="execbox-browser-")
    store = open_store(data_dir=data_dir)
    rec, token = store.tokens.create("default", "admin", "browser tests")
    close = getattr(store, "close", None)
    if close:
        close()
    try:
        with serve(data_dir) as (url, log):
            yield Server(url, token, rec.id, data_dir, log)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Package-scoped: while Playwright's sync API is up it marks an event loop as running in the
    main thread, and tests elsewhere that call asyncio.run() would fail."""
    require(os.access(CHROMIUM, os.X_OK), f"Debian chromium at {CHROMIUM} (scripts/setup/test/50-browser.sh)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        # launch() runs Chromium on a fresh temporary profile (its own --user-data-dir), removed on close.
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any, server: Server) -> Iterator[Any]:
    """A fresh browser context (no storage carried over) at desktop width."""
    w, hgt = WIDTHS["desktop"]
    context = browser.new_context(viewport={"width": w, "height": hgt}, base_url=server.url)
    context.set_default_timeout(30_000)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        yield pg
    finally:
        context.close()
    # Failed fetches (HTTP 4xx the test provoked) are logged by Chromium as console errors; script errors are bugs.
    assert not [e for e in errors if "Failed to load resource" not in e], errors


@pytest.fixture
def signed_in(page: Any, server: Server) -> Any:
    sign_in(page, server.admin_token)
    return page


def sign_in(page: Any, token: str) -> None:
    page.goto("/admin/")
    page.fill("#token", token)
    page.get_by_role("button", name="Sign in").click()
    page.locator("#nav").wait_for(state="visible")


@pytest.fixture(scope="session")
def screenshot() -> Callable[[Any, str], None]:
    """Save the page at both widths and check nothing overflows sideways at 390 px."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def take(page: Any, name: str) -> None:
        for label, (w, hgt) in WIDTHS.items():
            page.set_viewport_size({"width": w, "height": hgt})
            page.wait_for_timeout(50)
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{name} at {w}px scrolls sideways by {overflow}px"
            page.screenshot(path=str(ARTIFACTS / f"{name}-{label}-{w}.png"), full_page=True)
        page.set_viewport_size({"width": WIDTHS["desktop"][0], "height": WIDTHS["desktop"][1]})

    return take


@pytest.fixture(scope="session")
def jail_active(server: Server) -> None:
    """The jail provider with the runtime that has matplotlib, set active (what an operator does)."""
    with server.api() as api:
        r = api.post("/api/admin/sandbox/config", json={
            "provider_type": "jail", "set_active": True,
            "config": {"runtime": RUNTIME, "max_memory": "512m", "pool_size": 1}})
        assert r.status_code == 200, r.text
