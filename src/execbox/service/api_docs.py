"""The interactive API pages (Swagger UI at ``/docs``, ReDoc at ``/redoc``): off unless
EXECBOX_API_DOCS is true.

They are served from the admin console's origin, and both load their scripts from
cdn.jsdelivr.net: with them on, a compromise of that CDN (or of the floating ``@5``/``@2`` versions
FastAPI names) would run script in the origin whose tab holds an admin token (review 47, F7). So
they are off by default (``/openapi.json`` stays: it is data, not a page), and when an operator
turns them on each page carries a Content-Security-Policy that lets scripts come from that CDN
only, plus the page's own inline start-up script by its hash (Swagger UI has one; ReDoc's bundle
starts itself from the ``<redoc>`` element, so /redoc has none); styles come from that CDN and
inline, fonts from that CDN or ``data:``; nothing else may load from another origin, nothing may
frame it, and requests go to this origin only.
"""

from __future__ import annotations

import base64
import hashlib
import re

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import HTMLResponse

CDN = "https://cdn.jsdelivr.net"
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def csp_for(html: str) -> str:
    """The page's policy: scripts from :data:`CDN` and the page's own inline scripts (by hash)."""
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'"
                      for s in _INLINE_SCRIPT.findall(html))
    return (f"default-src 'none'; script-src {CDN} {hashes}".rstrip() + f"; style-src {CDN} 'unsafe-inline'; "
            f"img-src 'self' data:; font-src {CDN} data:; connect-src 'self'; worker-src blob:; "
            "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")


def _guarded(response: HTMLResponse) -> HTMLResponse:
    html = bytes(response.body).decode()
    response.headers.update({"Content-Security-Policy": csp_for(html), "X-Frame-Options": "DENY",
                             "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})
    return response


def install(app: FastAPI) -> None:
    """``/docs`` and ``/redoc`` with their CSP (create_app calls this with EXECBOX_API_DOCS on;
    the app itself is built with ``docs_url=None, redoc_url=None``)."""
    openapi_url = app.openapi_url or "/openapi.json"

    async def swagger(_: Request) -> HTMLResponse:
        return _guarded(get_swagger_ui_html(openapi_url=openapi_url, title=f"{app.title} - Swagger UI",
                                            swagger_favicon_url="data:,",
                                            swagger_ui_parameters={"validatorUrl": None}))

    async def redoc(_: Request) -> HTMLResponse:
        return _guarded(get_redoc_html(openapi_url=openapi_url, title=f"{app.title} - ReDoc",
                                       redoc_favicon_url="data:,", with_google_fonts=False))

    app.add_route("/docs", swagger, include_in_schema=False)
    app.add_route("/redoc", redoc, include_in_schema=False)


__all__ = ["CDN", "csp_for", "install"]
