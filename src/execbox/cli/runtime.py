"""`execbox runtime ...`: build, list and remove the Python runtimes jail boxes mount read-only."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..boxes import runtime as rt

runtime_app = typer.Typer(help="Sandbox runtimes for jail boxes (a venv per name, never execbox's own).",
                          no_args_is_help=True)
console = Console()


@runtime_app.command("install")
def install(
    packages: list[str] = typer.Argument(None, help="Requirements to install, e.g. numpy pandas matplotlib"),
    name: str = typer.Option("default", "--name", "-n", help="Runtime name (config key `runtime`)."),
) -> None:
    """Build (or rebuild) a runtime from the host's /usr/bin/python3 with PACKAGES."""
    pkgs = list(packages or [])
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task(f"runtime {name}", total=1.0)

        def report(message: str, fraction: float) -> None:
            progress.update(task, completed=fraction, description=f"runtime {name}: {message}")

        try:
            made = rt.install(name, pkgs, report)
        except rt.RuntimeNotUsable as e:
            console.print(f"[red]error (SB002):[/red] {e}")
            raise typer.Exit(2) from None
    console.print(f"runtime [bold]{made.name}[/bold] ready at {made.host_dir} "
                  f"(use it with the jail config `runtime={made.name}`)")


@runtime_app.command("list")
def list_() -> None:
    """Show the installed runtimes."""
    table = Table("name", "packages", "path")
    for r in rt.list_runtimes():
        table.add_row(str(r["name"]), " ".join(map(str, r["packages"])) or "-", str(r["path"] or r["python"]))
    console.print(table)


@runtime_app.command("remove")
def remove(name: str = typer.Argument(..., help="Runtime to delete")) -> None:
    """Delete a runtime (boxes already running keep their mount)."""
    try:
        removed = rt.remove(name)
    except rt.RuntimeNotUsable as e:
        console.print(f"[red]error (SB002):[/red] {e}")
        raise typer.Exit(2) from None
    if not removed:
        console.print(f"[red]error (SB002):[/red] runtime {name!r} is not installed")
        raise typer.Exit(2)
    console.print(f"removed runtime {name}")


def register(app: typer.Typer) -> None:
    app.add_typer(runtime_app, name="runtime")
