"""`execbox runtime ...`: build, list, show and remove runtime templates (jail boxes mount them)."""

from __future__ import annotations

import json
import time

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..boxes import runtime as rt
from ..errors import SandboxError

runtime_app = typer.Typer(help="Runtime templates: versioned, immutable package sets (pip + npm) that boxes "
                               "run with (jail config `runtime=NAME`, or runtime=NAME per session/run).",
                          no_args_is_help=True)
console = Console()


def _fail(e: Exception) -> typer.Exit:
    code = getattr(e, "code", "SB002")
    console.print(f"[red]error ({code}):[/red] {getattr(e, 'message', e)}", soft_wrap=True)
    return typer.Exit(2)


def _build(name: str, pip: list[str], npm: list[str], base: str | None, index_url: str | None,
           registry: str | None, docker: bool = False) -> None:
    from ..boxes.runtime_build import build

    client = None
    if docker:
        from ..providers.docker_config import docker_client

        try:
            client = docker_client()
            client.ping()
        except Exception as e:  # noqa: BLE001
            console.print(f"[red]error (SB009):[/red] docker engine not reachable: {e}")
            raise typer.Exit(3) from None

    columns = (SpinnerColumn(), TextColumn("[bold]{task.fields[name]}"), BarColumn(),
               TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
               TextColumn("{task.description}", style="dim"))
    started = time.monotonic()
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("starting", total=1.0, name=name)

        def report(message: str, fraction: float) -> None:
            progress.update(task, completed=fraction, description=message[:80])

        try:
            made = build(name, pip, npm, base=base, progress=report, index_url=index_url, registry=registry,
                         docker=client)
        except SandboxError as e:
            progress.stop()
            raise _fail(e) from None
    console.print(f"runtime [bold]{made.ref}[/bold] built in {time.monotonic() - started:.1f}s at "
                  f"{made.host_dir}; boxes use it with runtime={made.name} (or {made.ref} to pin it)",
                  soft_wrap=True)


@runtime_app.command("build")
def build_cmd(
    name: str = typer.Argument(..., help="Template name (lowercase letters, digits, '.', '_', '-')"),
    pip: list[str] = typer.Option([], "--pip", help="pip requirement (repeat), e.g. --pip numpy --pip 'httpx>=0.27'"),
    npm: list[str] = typer.Option([], "--npm", help="npm package (repeat), e.g. --npm axios --npm lodash@4"),
    base: str = typer.Option(None, "--from", help="Start from this template (NAME or NAME@vN) and add to it"),
    index_url: str = typer.Option(None, "--index-url", envvar="EXECBOX_PIP_INDEX_URL",
                                  help="pip index (internal mirror); default: https://pypi.org/simple (the "
                                       "host's pip configuration is not read)"),
    registry: str = typer.Option(None, "--npm-registry", envvar="EXECBOX_NPM_REGISTRY",
                                 help="npm registry (internal mirror); default: https://registry.npmjs.org/ "
                                      "(the host's npm configuration is not read)"),
    docker: bool = typer.Option(False, "--docker", help="Also build the image execbox/runtime-NAME:vN for the "
                                                        "docker provider (needs `execbox image build python`)"),
) -> None:
    """Build a new version of NAME (v1, v2, ...) and make it current. Versions never change once
    built; a failed build leaves the previous version current. Wheels only, no install scripts."""
    _build(name, pip, npm, base, index_url, registry, docker)


@runtime_app.command("install", hidden=True)
def install(
    packages: list[str] = typer.Argument(None, help="pip requirements"),
    name: str = typer.Option("default", "--name", "-n", help="Runtime name"),
) -> None:
    """Old spelling of `runtime build NAME --pip PKG...`."""
    _build(name, list(packages or []), [], None, None, None)


@runtime_app.command("list")
def list_() -> None:
    """Show the runtimes and their current versions."""
    table = Table("name", "current", "versions", "pip", "npm", "from")
    for r in rt.list_runtimes():
        table.add_row(str(r["name"]), str(r.get("version") or "-"), " ".join(map(str, r.get("versions") or [])) or "-",
                      " ".join(map(str, r["packages"])) or "-", " ".join(map(str, r.get("npm") or [])) or "-",
                      str(r.get("from") or "-"))
    console.print(table)


@runtime_app.command("show")
def show(name: str = typer.Argument(..., help="NAME or NAME@vN"),
         as_json: bool = typer.Option(False, "--json", help="Print JSON")) -> None:
    """Show one runtime version: packages, index, path, build time."""
    try:
        r = rt.resolve(name, list_known=True)
    except rt.RuntimeNotUsable as e:
        raise _fail(e) from None
    info = rt.describe(r)
    if as_json:
        typer.echo(json.dumps(info, indent=1))
        return
    for key, value in info.items():
        console.print(f"[bold]{key}[/bold]: {' '.join(map(str, value)) if isinstance(value, list) else value}",
                      soft_wrap=True)


@runtime_app.command("rm")
def rm(name: str = typer.Argument(..., help="NAME (every version) or NAME@vN (one old version)"),
       force: bool = typer.Option(False, "--force", help="Remove it even while running boxes mount it "
                                                       "(they lose their runtime)")) -> None:
    """Delete a runtime or one of its old versions. Refused while a running box mounts it."""
    try:
        removed = rt.remove(name, force=force)
    except rt.RuntimeNotUsable as e:
        raise _fail(e) from None
    if not removed:
        console.print(f"[red]error (SB002):[/red] runtime {name!r} is not installed")
        raise typer.Exit(2)
    console.print(f"removed runtime {name}")


runtime_app.command("remove", hidden=True)(rm)


def register(app: typer.Typer) -> None:
    app.add_typer(runtime_app, name="runtime")
