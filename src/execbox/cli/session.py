"""``execbox session ls|pause|resume|rm``: the session registry from the command line.

``ls`` reads the registry straight from the store (EXECBOX_DATA_DIR / EXECBOX_DATABASE_URL), so
it works with no service running. ``pause``, ``resume`` and ``rm`` act on boxes, which only the
owning replica holds: they call a running service (--url / EXECBOX_URL, the token in
EXECBOX_TOKEN, or --token, which other users can read in the process list), which forwards to
the owner.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

import httpx
import typer

from ..errors import ConnectionFailedError, SandboxError
from ..sdk.bounded import CALL_DEADLINE, MAX_RESPONSE_BYTES, clamp_client, deadline, read_body
from ..sdk.wire import Reply, reply_error
from ._store_cli import fail, store_from_cli

session_app = typer.Typer(help="List, pause, resume and remove sessions.", no_args_is_help=True)

URL = typer.Option("http://127.0.0.1:8080", "--url", envvar="EXECBOX_URL", help="The service's base URL.")
TOKEN = typer.Option(..., "--token", envvar="EXECBOX_TOKEN", show_default=False,
                     help="API token (the session's tenant, or admin). Prefer the "
                          "EXECBOX_TOKEN environment variable: a --token value is visible to other "
                          "users in the process list (ps).")


def _when(ts: Any) -> str:
    if ts is None:
        return ""
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        return str(ts)[:64]  # a service's answer is shown, not trusted to be a number
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    except (OverflowError, OSError, ValueError):
        return str(ts)


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


def _call(method: str, url: str, token: str, tenant: str, session: str, action: str) -> dict[str, Any]:
    """One call to the service, bounded (CALL_DEADLINE, MAX_RESPONSE_BYTES) and shape-checked: any
    failure is ``execbox: SB...`` and exit 2, never a traceback. ``tenant`` and ``session`` must be
    names the service accepts (SB002 otherwise) and are percent-encoded: each stays one path
    segment, so '../x' cannot reach another route."""
    from ..service.sessions.workspace import check_name  # the service's rule for both ids

    base = url.rstrip("/")
    try:
        path = f"{quote(check_name(tenant, 'tenant_id'), safe='')}/{quote(check_name(session, 'session_id'), safe='')}"
    except SandboxError as e:  # '..' or 'a/b' would otherwise name another route
        fail(e)
    path += f"/{action}"
    try:
        with clamp_client(httpx.Client(timeout=120)) as http, deadline(
                CALL_DEADLINE, ConnectionFailedError,
                f"execbox at {base} did not finish answering within {CALL_DEADLINE:g}s") as dl, http.stream(
                method, f"{base}/v1/sandbox/sessions/{path}", headers={"Authorization": f"Bearer {token}"}) as r:
            reply = Reply(r.status_code, read_body(r, MAX_RESPONSE_BYTES, dl, "the service's answer"),
                          r.request.url.path)
        if reply.status >= 300:
            fail(reply_error(reply))
        return reply.obj()
    except SandboxError as e:
        fail(e)
    except httpx.HTTPError as e:
        fail(ConnectionFailedError(f"cannot reach execbox at {base}: {type(e).__name__}: {e}", details={"url": base}))


@session_app.command("pause")
def pause(tenant: str = typer.Argument(...), session: str = typer.Argument(...), url: str = URL,
          token: str = TOKEN) -> None:
    """Stop the session's box (CPU and memory freed); its files stay until the retention ends."""
    out = _call("POST", url, token, tenant, session, "pause")
    typer.echo(f"paused {tenant}/{session}; deleted after {_when(out.get('expires_at'))} unless resumed")


@session_app.command("resume")
def resume(tenant: str = typer.Argument(...), session: str = typer.Argument(...), url: str = URL,
           token: str = TOKEN) -> None:
    """Start a paused session's box again, under the same session id."""
    out = _call("POST", url, token, tenant, session, "resume")
    lost = " (in-memory contexts were lost; files intact)" if out.get("contexts_lost") else ""
    typer.echo(f"resumed {tenant}/{session} on {out.get('owner')}{lost}")


@session_app.command("rm")
def rm(tenant: str = typer.Argument(...), session: str = typer.Argument(...), url: str = URL,
       token: str = TOKEN) -> None:
    """Destroy the session: its box, its workspace and its registry row (its tenant's token, or admin)."""
    _call("POST", url, token, tenant, session, "close")
    typer.echo(f"removed {tenant}/{session}")


def register(app: typer.Typer) -> None:
    app.add_typer(session_app, name="session")
