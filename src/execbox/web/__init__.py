"""The web admin console and playground: static HTML/CSS/JS modules served at ``/admin/``.

No build step: ``static/`` is shipped in the package as is and mounted by
``service.app.create_app`` through :class:`ConsoleStaticFiles` (see :func:`mount`), which adds
the console's security headers to every response. ``tokens_api`` adds the admin token routes the
console's Tokens page needs.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

__all__ = ["CONSOLE_CSP", "SECURITY_HEADERS", "STATIC_DIR", "ConsoleStaticFiles", "mount"]

STATIC_DIR = Path(__file__).resolve().parent / "static"

CONSOLE_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
               "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'")
"""The policy of index.html's CSP meta tag (keep the two identical; a browser test checks)."""

SECURITY_HEADERS = {
    # as a header the policy also covers what a meta tag cannot: who may frame the console
    "Content-Security-Policy": CONSOLE_CSP + "; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class ConsoleStaticFiles(StaticFiles):
    """StaticFiles that sends :data:`SECURITY_HEADERS` with every file it answers (200, 304,
    and the html-mode 404 page)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(SECURITY_HEADERS)
        return response


def mount(app: FastAPI, path: str = "/admin", directory: Path = STATIC_DIR) -> None:
    """Serve the console at ``path``/ (index.html for the directory), with its security headers."""
    app.mount(path, ConsoleStaticFiles(directory=directory, html=True), name="admin-console")
