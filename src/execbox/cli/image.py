"""``execbox image build [python|node|all]``: worker images for the docker provider, no registry."""

from __future__ import annotations

import time

import typer


def register(app: typer.Typer) -> None:
    image_app = typer.Typer(help="Build worker images for the docker provider (no registry needed).",
                            no_args_is_help=True)
    app.add_typer(image_app, name="image")

    @image_app.command("build")
    def build(
        flavor: str = typer.Argument("all", help="python, node or all"),
        force: bool = typer.Option(False, "--force", help="Rebuild even when the cached inputs match."),
        mirror: str = typer.Option("", help="Debian mirror (default: the host's apt source)."),
    ) -> None:
        """Debootstrap a Debian rootfs with python3 and node (plus numpy/pandas/matplotlib for
        python), `docker import` it, and cache it by an input hash."""
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from ..boxes import images
        from ..errors import SandboxError
        from ..providers.docker import docker_client

        console = Console()
        flavors = list(images.FLAVORS) if flavor == "all" else [flavor]
        try:
            specs = [images.image_for(f, mirror or None) for f in flavors]
            client = docker_client()
            client.ping()
        except SandboxError as e:
            console.print(f"[red]{e.code}[/red] {e.message}")
            raise typer.Exit(2) from None
        except Exception as e:  # noqa: BLE001
            console.print(f"[red]SB009[/red] docker engine not reachable: {e}")
            raise typer.Exit(3) from None
        columns = (SpinnerColumn(), TextColumn("[bold]{task.fields[flavor]:<7}"), BarColumn(),
                   TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
                   TextColumn("{task.description}", style="dim"))
        summary: list[str] = []
        with Progress(*columns, console=console, transient=False) as progress:
            for spec in specs:
                task = progress.add_task("checking cache", total=1.0, flavor=spec.flavor)

                def say(message: str, fraction: float | None, task: int = task) -> None:
                    progress.update(task, description=message[:70],
                                    **({"completed": fraction} if fraction is not None else {}))

                started = time.monotonic()
                try:
                    name, built = images.build_image(client, spec, progress=say, force=force)
                except SandboxError as e:
                    progress.stop()
                    console.print(f"[red]{e.code}[/red] {e.message}")
                    raise typer.Exit(1) from None
                line = f"{name} {'built' if built else 'cached'} in {time.monotonic() - started:.1f}s"
                progress.update(task, completed=1.0, description=line)
                summary.append(f"{line} (inputs {spec.input_hash})")
        for line in summary:
            console.print(line, soft_wrap=True)
