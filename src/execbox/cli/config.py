"""``execbox config show|set|activate|fallback``: the sandbox provider settings, through the same
validation as the admin API (schema + validate_config), secrets encrypted and shown redacted."""

from __future__ import annotations

import json
from typing import Any

import typer

from ..errors import InvalidConfigError, SandboxError
from ._store_cli import fail, store_from_cli

config_app = typer.Typer(help="Show and change the sandbox provider configuration.", no_args_is_help=True)


def _settings(store: Any):  # noqa: ANN202
    from ..service.store.sandbox_settings import SandboxSettings

    return SandboxSettings(store)


def _seeded_settings(store: Any):  # noqa: ANN202
    """Settings after first-boot seeding (so `config show` on a fresh install shows the seed)."""
    settings = _settings(store)
    settings.seed()
    return settings


def _fail_fields(err: SandboxError) -> None:
    fields = err.details.get("fields") if isinstance(err.details, dict) else None
    if fields:
        typer.echo(f"execbox: {err.code}: invalid configuration", err=True)
        for name, message in fields.items():
            typer.echo(f"  {name}: {message}", err=True)
        raise typer.Exit(2)
    fail(err)


@config_app.command("show")
def show(
    provider: str | None = typer.Argument(None, help="Only this provider."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (the admin API's GET /config shape)."),
) -> None:
    """Print the active provider, the fallback list and each provider's settings (secrets redacted).

    A provider whose settings cannot be read (a secret under another key) is shown with its error,
    and the command then exits 2."""
    from ..providers import registry

    try:
        with store_from_cli() as store:
            settings = _seeded_settings(store)
            names = [provider] if provider else registry.provider_names()
            if provider and provider not in registry.provider_names():
                raise InvalidConfigError(f"unknown provider {provider!r}",
                                         details={"known": registry.provider_names()})
            out: dict[str, Any] = {"active": settings.active(), "fallback": settings.fallback()}
            unreadable: list[SandboxError] = []
            for name in names:
                try:
                    out[name] = settings.redacted(name)
                except SandboxError as e:
                    out[name] = {"error": f"{e.code}: {e.message}"}
                    unreadable.append(e)
    except SandboxError as e:
        fail(e)
    if as_json:
        typer.echo(json.dumps(out, indent=2, default=str))
        if unreadable:
            raise typer.Exit(2)
        return
    typer.echo(f"active:   {out['active'] or '(zero-config: jail)'}")
    typer.echo(f"fallback: {', '.join(out['fallback']) or '(none)'}")
    for name in names:
        typer.echo(f"\n[{name}]")
        values = out[name]
        for key, value in values.items():
            typer.echo(f"  {key} = {json.dumps(value) if not isinstance(value, str) else value}")
    for e in unreadable:
        typer.echo(f"execbox: {e.code}: {e.message}", err=True)
    if unreadable:
        raise typer.Exit(2)


def _parse_pairs(pairs: list[str], schema: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    values: dict[str, Any] = {}
    unset: list[str] = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InvalidConfigError(f"{pair!r}: expected key=value", details={"fields": {pair: "expected key=value"}})
        spec = schema.get(key, {})
        if value == "":
            unset.append(key)
            continue
        if spec.get("secret") and value == "?":
            value = typer.prompt(f"{key}", hide_input=True)
        if spec.get("type") == "json":
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise InvalidConfigError(f"{key}: not valid JSON", details={"fields": {key: "must be JSON"}}) from None
        values[key] = value
    return values, unset


@config_app.command("set")
def set_(
    provider: str = typer.Argument(..., help="Provider id, e.g. local, jail, docker, e2b."),
    pairs: list[str] = typer.Argument(
        None, help="key=value (key= removes a stored value; secret=? prompts). A list setting takes "
                   "comma-separated values (network_allow=pypi.org,files.pythonhosted.org), not JSON."),
    activate: bool = typer.Option(False, "--activate", help="Also make this provider active."),
    test: bool = typer.Option(False, "--test", help="Run a probe program first; store only if it passes."),
) -> None:
    """Change some of a provider's settings (merged with what is stored), validated like the API."""
    from ..providers import registry
    from ..providers.schema import validate_against_schema
    from ..service.provider_probe import probe

    try:
        with store_from_cli() as store:
            settings = _seeded_settings(store)
            schema = registry.get_provider_class(provider).get_config_schema()
            values, unset = _parse_pairs(pairs or [], schema)
            merged = {k: v for k, v in settings.decrypted(provider).items() if k not in unset}
            merged.update(values)
            for key in unset:
                if schema.get(key, {}).get("secret"):
                    merged[key] = ""  # explicit clear (omitted secrets are kept)
            clean = settings.validate(provider, merged)
            if test:
                full, _ = validate_against_schema(schema, clean)
                result = probe(provider, full)
                if not result["success"]:
                    typer.echo(f"execbox: SB003: connection test failed, nothing stored: {result['message']}",
                               err=True)
                    raise typer.Exit(2)
                typer.echo(f"probe ok in {result['latency_ms']} ms")
            settings.save(provider, clean, set_active=activate)
            shown = settings.redacted(provider)
    except SandboxError as e:
        _fail_fields(e)
    changed = sorted(set(values) | set(unset))
    typer.echo(f"saved {provider}: " + ", ".join(f"{k}={shown.get(k)!s}" for k in changed)
               + (" (now active)" if activate else ""))


@config_app.command("activate")
def activate_(provider: str = typer.Argument(..., help="Provider to make active.")) -> None:
    """Make a configured provider the active one (every service process picks it up)."""
    try:
        with store_from_cli() as store:
            _seeded_settings(store).set_active(provider)
    except SandboxError as e:
        _fail_fields(e)
    typer.echo(f"active provider: {provider}")
    _warn_if_unisolated([provider])


@config_app.command("fallback")
def fallback(providers: list[str] = typer.Argument(
        None, help="Providers in order; `none` (or no argument) clears the list.")) -> None:
    """Set the providers tried, in order, when the active one is unavailable (SB003/SB009)."""
    if providers == ["none"]:
        providers = []
    try:
        with store_from_cli() as store:
            _seeded_settings(store).set_fallback(list(providers or []))
    except SandboxError as e:
        _fail_fields(e)
    typer.echo(f"fallback: {', '.join(providers or []) or '(none)'}")
    _warn_if_unisolated(list(providers or []))


def _warn_if_unisolated(names: list[str]) -> None:
    from ..providers import registry
    from ..providers.base import Isolation

    for name in names:
        try:
            unisolated = Isolation(registry.get_provider_class(name).isolation) == Isolation.NONE
        except SandboxError:
            continue
        if unisolated:
            typer.echo(f"warning: {name!r} has no isolation: code runs as the service's own user. A service "
                       "listening on a non-loopback address refuses it unless started with --allow-no-isolation.",
                       err=True)


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
