"""A web page on another origin cannot make the visitor's browser run code on an open (loopback,
no token) executor /run: the simple cross-site POSTs a page can send without a CORS preflight
(text/plain fetch, sendBeacon, a text/plain form) are refused, and the preflight a JSON POST needs
is never granted. Real Chromium, a real `/run` server on 127.0.0.1, the page on 127.0.0.2."""

from __future__ import annotations

import base64
import functools
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from execbox.providers.local import LocalProvider
from execbox.service.routes.executor_compat import ExecutorAuth, create_executor_app
from tests.unit.remote.http_server import ThreadedServer, free_port

PAGE = """<!doctype html><html><body><p>innocent page</p>
<form id="f" method="POST" enctype="text/plain" target="sink" action="RUN">
  <input name='FORM_NAME' value='FORM_VALUE'></form>
<iframe name="sink"></iframe>
<script>
const body = n => JSON.stringify({code_b64: CODES[n]});
const results = {};
window.attack = async () => {
  try {
    await fetch("RUN", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: body(0)});
    results.nocors = "sent";
  } catch (e) { results.nocors = "error " + e; }
  results.beacon = navigator.sendBeacon("RUN", new Blob([body(1)], {type: "text/plain"}));
  try {
    const r = await fetch("RUN", {method: "POST", headers: {"Content-Type": "application/json"}, body: body(2)});
    results.cors = "status " + r.status;
  } catch (e) { results.cors = "blocked"; }
  document.getElementById("f").submit();
  return results;
};
</script></body></html>"""


@pytest.fixture
def open_executor() -> Iterator[str]:
    provider = LocalProvider()
    provider.initialize({})
    app = create_executor_app(provider, auth=ExecutorAuth.for_bind("127.0.0.1"), owns_provider=True)
    srv = ThreadedServer(app, free_port()).start()
    try:
        yield srv.url
    finally:
        srv.stop()


def test_cross_site_page_cannot_run_code_on_open_executor(browser: Any, open_executor: str, tmp_path: Path) -> None:
    markers = [tmp_path / f"ran-{i}" for i in range(4)]
    codes = [base64.b64encode(f"open({str(m)!r}, 'w').write('pwned')\n".encode()).decode() for m in markers]
    # text/plain form bodies are "name=value": a name ending in '"x":"' makes the whole body JSON
    form_json = json.dumps({"code_b64": codes[3], "x": "PAD"})
    name, value = form_json.split("PAD")[0], "PAD" + form_json.split("PAD")[1]
    html = (PAGE.replace("RUN", open_executor + "/run").replace("CODES", json.dumps(codes))
            .replace("FORM_NAME", name.replace("'", "&#39;")).replace("FORM_VALUE", value.replace("'", "&#39;")))
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(html)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    evil = http.server.ThreadingHTTPServer(("127.0.0.2", free_port()), handler)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"http://127.0.0.2:{evil.server_address[1]}/index.html")
        results = page.evaluate("window.attack()")
        page.wait_for_timeout(1_500)  # the beacon and the form POST land after the page moved on
    finally:
        context.close()
        evil.shutdown()
        evil.server_close()
    assert results["cors"] == "blocked", results  # the preflight was not granted
    assert [m.name for m in markers if m.exists()] == [], results
    # the same server still runs what a program sends (so the checks above are not vacuous)
    probe = tmp_path / "probe"
    r = httpx.post(open_executor + "/run", timeout=60, json={
        "code_b64": base64.b64encode(f"open({str(probe)!r}, 'w').write('ok')\n".encode()).decode()})
    assert r.status_code == 200 and probe.read_text() == "ok", r.text
