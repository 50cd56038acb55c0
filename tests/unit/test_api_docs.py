"""Review 47 F7: /docs and /redoc (pages that load a CDN's scripts in the console's origin) are
off unless EXECBOX_API_DOCS is set; /openapi.json stays. Turned on, each page carries a CSP that
lets scripts come from that CDN and the page's own inline script (by hash) only."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
from fastapi.testclient import TestClient

from execbox.errors import InvalidConfigError
from execbox.service.app import create_app
from execbox.service.config import ServiceSettings
from execbox.service.crypto import KeyRing, generate_key
from execbox.service.provider_manager import ProviderManager
from execbox.service.store import open_store


def _client(tmp_path, settings: ServiceSettings):  # noqa: ANN001, ANN202
    store = open_store(tmp_path)
    providers = ProviderManager(store, keyring=KeyRing(generate_key(), "test"), env={"SANDBOX_TYPE": "local"},
                                seed_file=None)
    return TestClient(create_app(store=store, providers=providers, settings=settings)), store, providers


def test_docs_pages_are_off_by_default_and_the_document_stays(tmp_path) -> None:  # noqa: ANN001
    client, store, providers = _client(tmp_path, ServiceSettings.from_env({}))
    try:
        with client:
            assert client.get("/docs").status_code == 404
            assert client.get("/redoc").status_code == 404
            assert client.get("/docs/oauth2-redirect").status_code == 404
            r = client.get("/openapi.json")
            assert r.status_code == 200 and "/v1/sandbox/execute" in r.json()["paths"]
    finally:
        providers.shutdown()
        store.close()


def test_turned_on_each_page_allows_that_cdn_and_its_own_inline_script_only(tmp_path) -> None:  # noqa: ANN001
    client, store, providers = _client(tmp_path, ServiceSettings.from_env({"EXECBOX_API_DOCS": "true"}))
    try:
        with client:
            for path in ("/docs", "/redoc"):
                r = client.get(path)
                assert r.status_code == 200
                csp = r.headers["content-security-policy"]
                directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
                assert directives["default-src"] == "'none'" and directives["frame-ancestors"] == "'none'"
                assert directives["connect-src"] == "'self'" and directives["base-uri"] == "'none'"
                inline = re.findall(r"<script>(.*?)</script>", r.text, re.DOTALL)
                hashes = {f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'"
                          for s in inline}
                assert set(directives["script-src"].split()) == {"https://cdn.jsdelivr.net", *hashes}
                assert len(hashes) == (1 if path == "/docs" else 0)  # ReDoc's bundle starts itself
                # the rest as docs/http-api.md "API documentation pages" describes it
                assert directives["style-src"] == "https://cdn.jsdelivr.net 'unsafe-inline'"
                assert directives["font-src"] == "https://cdn.jsdelivr.net data:"
                assert directives["img-src"] == "'self' data:" and directives["worker-src"] == "blob:"
                assert directives["form-action"] == "'none'"
                origins = set(re.findall(r"""(?:src|href)=["'](https?://[^/"']+)""", r.text))
                assert origins <= {"https://cdn.jsdelivr.net"}, origins  # no favicon or fonts from elsewhere
                assert r.headers["x-frame-options"] == "DENY"
            assert "/docs" not in client.get("/openapi.json").json()["paths"]
    finally:
        providers.shutdown()
        store.close()


def test_the_setting_is_read_strictly() -> None:
    assert ServiceSettings.from_env({}).api_docs is False
    assert ServiceSettings.from_env({"EXECBOX_API_DOCS": "1"}).api_docs is True
    with pytest.raises(InvalidConfigError) as e:
        ServiceSettings.from_env({"EXECBOX_API_DOCS": "maybe"})
    assert "EXECBOX_API_DOCS" in e.value.message
