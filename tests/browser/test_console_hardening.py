"""Console hardening: box-made artifacts never become active documents in the console's origin
(only raster images are shown inline; everything else is an application/octet-stream download),
and /admin is served with a CSP header (frame-ancestors 'none'), X-Frame-Options, nosniff and
no-referrer, so another origin cannot frame it."""

from __future__ import annotations

import base64
from typing import Any

import httpx

from .conftest import Server

# What a tenant can plant in its workspace: an SVG (and an HTML page) whose script, if it ever runs
# in the console's origin, marks localStorage and could read the admin token from sessionStorage.
SVG = ('<svg xmlns="http://www.w3.org/2000/svg" width="80" height="40"><rect width="80" height="40" '
       'fill="teal"/><script>localStorage.setItem("pwned", "svg:" + '
       'sessionStorage.getItem("execbox.console.token"))</script></svg>')
HTML = '<!doctype html><script>localStorage.setItem("pwned", "html")</script>'
# 1x1 transparent GIF: a raster artifact, still shown inline
GIF = base64.b64decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")

PLANT = f"""import os
os.makedirs("artifacts", exist_ok=True)
open("artifacts/chart.svg", "w").write({SVG!r})
open("artifacts/page.html", "w").write({HTML!r})
open("artifacts/dot.gif", "wb").write({GIF!r})
print("planted")
"""


def test_scriptable_artifacts_are_downloads_never_documents(signed_in: Any, jail_active: None) -> None:
    page = signed_in
    # record each object URL's blob type (the console's CSP keeps fetch() off blob: URLs)
    page.add_init_script("""(() => { const orig = URL.createObjectURL.bind(URL); window.__blobTypes = {};
        URL.createObjectURL = b => { const u = orig(b); window.__blobTypes[u] = b.type; return u; }; })()""")
    page.goto("/admin/#/playground")
    page.reload()
    page.fill("#pg-code", PLANT)
    page.fill("#pg-args", "")
    page.fill("#pg-session", "")
    page.get_by_role("button", name="Run", exact=True).click()
    page.locator('#pg-status[data-state="done"]').wait_for(timeout=60_000)
    figures = page.locator("#pg-artifacts figure")
    figures.nth(2).wait_for()
    page.locator('#pg-artifacts figure[data-name="dot.gif"] img').wait_for()  # raster: inline

    for name in ("chart.svg", "page.html"):
        fig = page.locator(f'#pg-artifacts figure[data-name="{name}"]')
        fig.locator("img, a, .error").first.wait_for()  # loaded: shown, offered, or failed
        assert fig.locator("img").count() == 0, f"{name} must not be inlined"
        link = fig.get_by_role("link", name=f"Download {name}")
        href = link.get_attribute("href")
        assert href.startswith("blob:")
        assert link.get_attribute("download") == name
        blob_type = page.evaluate("u => window.__blobTypes[u]", href)
        assert blob_type == "application/octet-stream", (name, blob_type)
        # Open the blob top-level from the console (what 'open in new tab' does): a download, no script.
        try:
            with page.context.expect_page(timeout=5_000) as opened:
                page.evaluate("u => { window.open(u); }", href)
            opened.value.wait_for_timeout(1_000)
            opened.value.close()
        except Exception:  # noqa: BLE001 - a download may open no page at all: also fine
            pass
    page.wait_for_timeout(500)
    assert page.evaluate("() => localStorage.getItem('pwned')") is None
    gif = page.locator('#pg-artifacts figure[data-name="dot.gif"] img').get_attribute("src")
    assert page.evaluate("u => window.__blobTypes[u]", gif) == "image/gif"


CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


def test_console_responses_carry_security_headers(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for path in ("/admin/", "/admin/index.html", "/admin/app.js", "/admin/style.css"):
            r = c.get(path)
            assert r.status_code == 200, (path, r.status_code)
            assert r.headers.get("content-security-policy") == CSP, path
            assert r.headers.get("x-frame-options") == "DENY", path
            assert r.headers.get("x-content-type-options") == "nosniff", path
            assert r.headers.get("referrer-policy") == "no-referrer", path
        # the header policy is the meta tag's policy plus frame-ancestors (meta cannot carry it)
        index = c.get("/admin/").text
        assert f'content="{CSP.removesuffix("; frame-ancestors " + chr(39) + "none" + chr(39))}"' in index


def test_another_origin_cannot_frame_the_console(browser: Any, server: Server) -> None:
    context = browser.new_context()
    page = context.new_page()
    frame_host = server.url.replace("127.0.0.1", "localhost")  # a different origin, same server
    page.goto(frame_host + "/healthz")
    page.evaluate("""u => new Promise(done => {
        const f = document.createElement("iframe");
        f.src = u; f.onload = () => done(); document.body.append(f);
        setTimeout(done, 5000);
    })""", server.url + "/admin/")
    page.wait_for_timeout(1_000)
    child = page.frames[1]
    # blocked by frame-ancestors / X-Frame-Options: the frame holds Chromium's error page, not the console
    try:
        assert child.url.startswith("chrome-error://"), child.url
        assert child.locator("#token").count() == 0
    finally:
        context.close()
