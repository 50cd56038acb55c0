"""``execbox doctor``: which isolation tiers work on this host, and why not."""

from __future__ import annotations

import json
import time
from typing import Any

import typer


def collect(probe: bool = True) -> dict[str, Any]:
    """Facts for every installed provider, the zero-config choice, and an optional live probe."""
    from ..errors import SandboxError
    from ..models import TIER_ORDER, Isolation
    from ..providers.registry import get_provider_class, provider_names, strongest_available

    providers: dict[str, Any] = {}
    for name in provider_names():
        entry: dict[str, Any] = {}
        try:
            cls = get_provider_class(name)
        except SandboxError as e:
            providers[name] = {"usable": False, "reason": e.message, "tier": None}
            continue
        ok, reason = cls.availability()
        entry.update({"usable": ok, "reason": reason, "tier": Isolation(cls.isolation).value,
                      "zero_config": cls.zero_config, "description": cls.description})
        diagnose = getattr(cls, "diagnose", None)
        if callable(diagnose):
            try:
                entry["checks"] = diagnose()
            except Exception as e:  # noqa: BLE001 - doctor reports, never crashes
                entry["checks"] = {"error": str(e)}
        providers[name] = entry
    report: dict[str, Any] = {"providers": providers}
    try:
        choice, skipped = strongest_available()
        report["zero_config"] = {"provider": choice, "skipped": skipped}
    except SandboxError as e:
        report["zero_config"] = {"provider": None, "error": e.message}
    report["tiers"] = {
        t.value: sorted(n for n, p in providers.items() if p.get("tier") == t.value and p.get("usable"))
        for t in TIER_ORDER
    }
    if probe and report["zero_config"].get("provider"):
        report["probe"] = _probe(report["zero_config"]["provider"])
    return report


def _probe(name: str) -> dict[str, Any]:
    """Start the provider with a one-box pool, run print(1), report timing and pool health."""
    from ..errors import SandboxError, operator_message
    from ..providers.registry import create_provider

    started = time.monotonic()
    provider = None
    try:
        schema_cls = __import__("execbox.providers.registry", fromlist=["get_provider_class"])
        cls = schema_cls.get_provider_class(name)
        config = {"pool_size": 1} if "pool_size" in cls.get_config_schema() else {}
        provider = create_provider(name, config)
        inst = provider.create_instance()
        try:
            res = provider.execute_code(inst.instance_id, "print(1)", "python", 30)
        finally:
            provider.destroy_instance(inst.instance_id)
        pool = getattr(provider, "pool_status", lambda: None)()
        return {"provider": name, "ok": res.exit_code == 0 and res.stdout.strip() == "1",
                "stdout": res.stdout, "stderr": res.stderr[-500:], "exit_code": res.exit_code,
                "seconds": round(time.monotonic() - started, 3), "pool": pool,
                "isolation": res.metadata.get("isolation")}
    except SandboxError as e:
        return {"provider": name, "ok": False, "error": operator_message(e)}
    except Exception as e:  # noqa: BLE001
        return {"provider": name, "ok": False, "error": f"{type(e).__name__}: {e}"}
    finally:
        if provider is not None:
            provider.shutdown()


def doctor(
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    probe: bool = typer.Option(True, "--probe/--no-probe", help="Run print(1) on the zero-config provider."),
) -> None:
    """Show which isolation tiers work on this host (gvisor > container > jail > none) and why not.

    Exits 1 when the zero-config provider (the jail) cannot run here or its probe run fails (so
    scripts and readiness checks can use it), 0 otherwise; other providers are listed but do not
    change the exit status, and the probe ignores the settings store's active provider."""
    report = collect(probe)
    code = exit_code(report)
    if as_json:
        typer.echo(json.dumps(report, indent=2, default=str))
        raise typer.Exit(code)
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="execbox providers on this host")
    for col in ("provider", "tier", "usable", "reason"):
        table.add_column(col)
    for name, p in report["providers"].items():
        table.add_row(name, str(p.get("tier")), "yes" if p.get("usable") else "no", str(p.get("reason", "")))
    console.print(table)
    for name, p in report["providers"].items():
        for check, value in (p.get("checks") or {}).items():
            console.print(f"  {name}: {check}: {value}")
    zc = report["zero_config"]
    if zc.get("provider"):
        console.print(f"zero-config choice: [bold]{zc['provider']}[/bold]")
        for n, why in (zc.get("skipped") or {}).items():
            console.print(f"  skipped {n}: {why}")
    else:
        console.print(f"[red]no usable provider[/red]: {zc.get('error')}")
    pr = report.get("probe")
    if pr:
        status = "[green]ok[/green]" if pr.get("ok") else "[red]failed[/red]"
        console.print(f"probe on {pr['provider']}: {status} {pr.get('seconds', '')}s "
                      f"{pr.get('error', '')}")
        if pr.get("pool"):
            console.print(f"  pool: {pr['pool']}")
    raise typer.Exit(code)


def exit_code(report: dict[str, Any]) -> int:
    """1 when the zero-config provider (the jail) cannot run here or its probe failed, else 0."""
    if not report["zero_config"].get("provider"):
        return 1
    probe = report.get("probe")
    return 1 if probe is not None and not probe.get("ok") else 0


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
