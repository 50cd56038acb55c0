"""``execbox token create|list|revoke``: API tokens for the HTTP service (plaintext shown once)."""

from __future__ import annotations

import json
import time

import typer

from ..errors import SandboxError
from ._store_cli import fail, store_from_cli

token_app = typer.Typer(help="Create, list and revoke API tokens.", no_args_is_help=True)


@token_app.command("create")
def create(
    tenant: str = typer.Option(..., "--tenant", "-t", help="Tenant the token acts for: 1-64 letters, digits, "
                                                          "'_', '.' or '-' (not starting with '.' or '-')."),
    admin: bool = typer.Option(False, "--admin", help="Admin token (admin API and console)."),
    name: str | None = typer.Option(None, "--name", "-n", help="A label to recognise the token by."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Create a token and print it once (only its hash is stored)."""
    from ..service.sessions.workspace import check_name  # the service's own rule for tenant ids

    try:
        check_name(tenant, "tenant_id")  # a tenant id every sandbox request would refuse: SB002 now
        with store_from_cli() as store:
            rec, plaintext = store.tokens.create(tenant, "admin" if admin else "tenant", name)
    except SandboxError as e:
        fail(e)
    if as_json:
        typer.echo(json.dumps({**rec.to_dict(), "token": plaintext}))
        return
    typer.echo(plaintext)
    typer.echo(f"created {rec.id} (tenant={rec.tenant_id}, role={rec.role}); "
               "store this token now: it is not shown again", err=True)


@token_app.command("list")
def list_(
    all_: bool = typer.Option(False, "--all", help="Include revoked tokens."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List tokens (never whole: the fixed ebx_ tag and the last 4 characters)."""
    try:
        with store_from_cli() as store:
            records = store.tokens.list(include_revoked=all_)
    except SandboxError as e:
        fail(e)
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in records]))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("id", "tenant", "role", "name", "token", "created", "status")
    for r in records:
        table.add_row(r.id, r.tenant_id, r.role, r.name or "", r.display,
                      time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.created_at)),
                      "revoked" if r.revoked_at else "active")
    Console().print(table)


@token_app.command("revoke")
def revoke(token_id: str = typer.Argument(..., help="Token id (tok_...).")) -> None:
    """Revoke a token; requests using it get 401 at once."""
    try:
        with store_from_cli() as store:
            ok = store.tokens.revoke(token_id)
    except SandboxError as e:
        fail(e)
    if not ok:
        typer.echo(f"execbox: SB002: no active token with id {token_id!r}", err=True)
        raise typer.Exit(2)
    typer.echo(f"revoked {token_id}")


def register(app: typer.Typer) -> None:
    app.add_typer(token_app, name="token")
