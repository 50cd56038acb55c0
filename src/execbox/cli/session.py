"""``execbox session ls|pause|resume|rm``: the session registry from the command line.

``ls`` reads the registry straight from the store (EXECBOX_DATA_DIR / EXECBOX_DATABASE_URL), so
it works with no service running. ``pause``, ``resume`` and ``rm`` act on boxes, which only the
owning replica holds: they call a running service (--url / EXECBOX_URL, --token / EXECBOX_TOKEN),
which forwards to the owner.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import typer

from ..errors import ConnectionFailedError, SandboxError, error_from_dict
from ._store_cli import fail, store_from_cli

session_app = typer.Typer(help="List, pause, resume and remove sessions.", no_args_is_help=True)

URL = typer.Option("http://127.0.0.1:8080", "--url", envvar="EXECBOX_URL", help="The service's base URL.")
TOKEN = typer.Option(..., "--token", envvar="EXECBOX_TOKEN",
                     help="API token (the session's tenant, or admin; rm needs admin).")


def _when(ts: float | None) -> str:
    return "" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


@session_app.command("ls")
def ls(
    tenant: str | None = typer.Option(None, "--tenant", "-t", help="Only this tenant's sessions."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Every session in the registry: state, owning replica, last use, expiry."""
    try:
        with store_from_cli() as store:
            records = store.sessions.list(tenant)
    except SandboxError as e:
        fail(e)
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in records]))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("tenant", "session", "state", "owner", "provider", "contexts lost", "last used", "expires")
    for r in records:
        table.add_row(r.tenant_id, r.session_id, r.state, r.owner or "", r.provider or "",
                      "yes" if r.contexts_lost else "", _when(r.last_used), _when(r.expires_at))
    Console().print(table)


def _call(method: str, url: str, token: str, path: str) -> Any:
    try:
        r = httpx.request(method, f"{url.rstrip('/')}/v1/sandbox/sessions/{path}",
                          headers={"Authorization": f"Bearer {token}"}, timeout=120)
    except httpx.HTTPError as e:
        fail(ConnectionFailedError(f"cannot reach execbox at {url}: {e}", details={"url": url}))
    if r.status_code >= 400:
        try:
            fail(error_from_dict(r.json(), r.status_code))
        except ValueError:
            fail(SandboxError(f"HTTP {r.status_code}: {r.text[:200]}"))
    return r.json()


@session_app.command("pause")
def pause(tenant: str = typer.Argument(...), session: str = typer.Argument(...), url: str = URL,
          token: str = TOKEN) -> None:
    """Stop the session's box (CPU and memory freed); its files stay until the retention ends."""
    out = _call("POST", url, token, f"{tenant}/{session}/pause")
    typer.echo(f"paused {tenant}/{session}; deleted after {_when(out.get('expires_at'))} unless resumed")


@session_app.command("resume")
def resume(tenant: str = typer.Argument(...), session: str = typer.Argument(...), url: str = URL,
           token: str = TOKEN) -> None:
    """Start a paused session's box again, under the same session id."""
    out = _call("POST", url, token, f"{tenant}/{session}/resume")
    lost = " (in-memory contexts were lost; files intact)" if out.get("contexts_lost") else ""
    typer.echo(f"resumed {tenant}/{session} on {out.get('owner')}{lost}")


@session_app.command("rm")
def rm(tenant: str = typer.Argument(...), session: str = typer.Argument(...), url: str = URL,
       token: str = TOKEN) -> None:
    """Destroy the session: its box, its workspace and its registry row (admin token)."""
    _call("DELETE", url, token, f"{tenant}/{session}")
    typer.echo(f"removed {tenant}/{session}")


def register(app: typer.Typer) -> None:
    app.add_typer(session_app, name="session")
