"""The web admin console and playground: static HTML/CSS/JS modules served at ``/admin/``.

No build step: ``static/`` is shipped in the package as is and mounted by
``service.app.create_app`` (see :func:`mount`). ``tokens_api`` adds the admin token routes the
console's Tokens page needs.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent / "static"


def mount(app: FastAPI, path: str = "/admin") -> None:
    """Serve the console at ``path``/ (index.html for the directory)."""
    app.mount(path, StaticFiles(directory=STATIC_DIR, html=True), name="admin-console")
