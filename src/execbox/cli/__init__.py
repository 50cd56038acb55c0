"""The ``execbox`` command. Each module in this package adds its commands via ``register(app)``.

Modules are discovered, not listed, so each area (run, doctor, serve, token, config, image,
runtime, ...) owns its own file.
"""

from __future__ import annotations

import importlib
import pkgutil

import typer

app = typer.Typer(
    name="execbox",
    help="Run untrusted Python, JavaScript and bash in isolated per-tenant sandboxes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_all() -> None:
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{mod.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_all()


def main() -> None:
    app()
