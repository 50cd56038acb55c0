"""``execbox db upgrade|status``: the settings database's schema (Alembic, shipped in the package)."""

from __future__ import annotations

import typer

from ..errors import SandboxError
from ._store_cli import fail

db_app = typer.Typer(help="Settings database (SQLite in EXECBOX_DATA_DIR or EXECBOX_DATABASE_URL).",
                     no_args_is_help=True)


@db_app.command("upgrade")
def upgrade(revision: str = typer.Argument(
        "head", help="Target revision (default head); one older than the database's is refused.")) -> None:
    """Run the migrations (the service also runs them on start). Downgrades are not supported."""
    from ..service.store import open_store
    from ..service.store import upgrade as run_upgrade

    try:
        store = open_store(migrate=False)
        try:
            before = store.revision()
            run_upgrade(store.engine, revision)
            typer.echo(f"{store.url}: {before or 'empty'} -> {store.revision()}")
        finally:
            store.close()
    except SandboxError as e:
        fail(e)


@db_app.command("status")
def status() -> None:
    """Show the database URL (password hidden), its revision and the newest one this execbox knows.

    Exits 2 when the database is at a revision this execbox does not know (a newer execbox wrote it)."""
    from ..service.store import open_store
    from ..service.store.engine import head_revision
    from ..service.store.schema_revisions import is_newer, newer_database_error

    try:
        store = open_store(migrate=False)
        try:
            current, head = store.revision(), head_revision()
            typer.echo(f"database: {store.url}")
            if is_newer(current):
                typer.echo(f"revision: {current} (head {head}) - newer than this execbox")
                raise newer_database_error(str(current), store.url)
            hint = "" if current == head else " - run `execbox db upgrade`"
            typer.echo(f"revision: {current or 'empty'} (head {head}){hint}")
        finally:
            store.close()
    except SandboxError as e:
        fail(e)


def register(app: typer.Typer) -> None:
    app.add_typer(db_app, name="db")
