"""Helpers shared by the store-backed commands (token, config, secrets, db)."""

from __future__ import annotations

import json
from typing import NoReturn

import typer

from ..errors import SandboxError


def store_from_cli():
    """The store named by EXECBOX_DATABASE_URL / EXECBOX_DATA_DIR, migrated."""
    from ..service.store import open_store

    return open_store()


def fail(err: SandboxError, code: int = 2) -> NoReturn:
    typer.echo(f"execbox: {err.code}: {err.message}", err=True)
    if err.details:
        typer.echo(f"details: {json.dumps(err.details, default=str)}", err=True)
    raise typer.Exit(code)
