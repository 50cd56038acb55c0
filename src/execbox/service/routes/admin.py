"""Admin API for sandbox providers (``/api/admin/sandbox/...``; admin token required).

Every write goes through the same validation as the CLI (schema + the provider's
``validate_config``) and answers 400 with ``details.fields = {field: message}``; secrets are
encrypted at rest and only ever returned redacted ("****" + last 4 characters).
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from ...errors import ConnectionFailedError, InvalidConfigError, SandboxError
from ...providers import registry
from ..auth import Principal, require_admin
from ..container import services
from ..provider_probe import probe
from ..sessions import NAME_PATTERN
from ..store.sandbox_settings import SandboxSettings

router = APIRouter(prefix="/api/admin/sandbox", tags=["admin"])


class ConfigBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    provider_type: str
    config: dict[str, Any] = Field(default_factory=dict)
    set_active: bool = True
    test_connection: bool = False


class TestBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    provider_type: str
    config: dict[str, Any] = Field(default_factory=dict)


class ActiveBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    provider: str


class FallbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    providers: list[str]


def sandbox_settings(request: Request) -> SandboxSettings:
    """The ProviderManager's settings when the app has one (shared key ring), else the store's."""
    return services(request).sandbox_settings


def _known(name: str) -> str:
    known = registry.provider_names()
    if name not in known:
        raise InvalidConfigError(f"unknown provider {name!r}; installed: {', '.join(known)}",
                                 details={"fields": {"provider_type": "unknown provider"}, "known": known})
    return name


def _describe(name: str, settings: SandboxSettings, active: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": name, "name": name.replace("_", " ").title(), "active": name == active,
                             "configured": settings.is_configured(name)}
    try:
        cls = registry.get_provider_class(name)
    except SandboxError as e:
        return {**entry, "description": "", "tags": [], "config_schema": {}, "supported_languages": [],
                "isolation": None, "usable": False, "reason": e.message}
    try:
        languages = cls().get_supported_languages()
    except Exception:  # noqa: BLE001 - some providers need a config to know
        languages = []
    try:
        usable, reason = cls.availability()
    except Exception as e:  # noqa: BLE001
        usable, reason = False, f"availability check failed: {e}"
    return {**entry, "name": cls.display_name or entry["name"], "description": cls.description,
            "tags": list(cls.tags), "config_schema": cls.get_config_schema(),
            "supported_languages": languages, "isolation": str(getattr(cls.isolation, "value", cls.isolation)),
            "zero_config": cls.zero_config, "usable": usable, "reason": reason}


@router.get("/providers")
def list_providers(request: Request, _: Principal = Depends(require_admin)) -> dict[str, Any]:
    """Every installed provider with its schema and whether it is usable on this host."""
    settings = sandbox_settings(request)
    active = settings.active()
    return {"data": [_describe(n, settings, active) for n in registry.provider_names()]}


@router.get("/config")
def get_config(request: Request, _: Principal = Depends(require_admin)) -> dict[str, Any]:
    """``{"active", "fallback", "<provider>": {...}}``: stored values or schema defaults, secrets redacted."""
    settings = sandbox_settings(request)
    out: dict[str, Any] = {"active": settings.active(), "fallback": settings.fallback()}
    holder = services(request).providers
    if out["active"] is None and hasattr(holder, "active_name"):
        try:
            out["zero_config"] = {"provider": holder.active_name, "note": holder.selection_note}
        except SandboxError as e:
            out["zero_config"] = {"provider": None, "note": e.message}
    for name in registry.provider_names():
        try:
            out[name] = settings.redacted(name)
        except SandboxError as e:
            out[name] = {"error": {"code": e.code, "message": e.message}}
    return out


@router.post("/config")
def set_config(body: ConfigBody, request: Request, _: Principal = Depends(require_admin)) -> dict[str, Any]:
    """Validate, optionally probe, then store (and activate) one provider's configuration."""
    settings = sandbox_settings(request)
    name = _known(body.provider_type)
    clean = settings.validate(name, body.config)
    test = None
    if body.test_connection:
        test = probe(name, _with_defaults(name, clean))
        if not test["success"]:
            raise ConnectionFailedError(f"connection test failed; configuration not saved: {test['message']}",
                                        details={"provider": name, "test": test})
    if body.set_active:
        _isolation_allowed(request, [name])
    version = settings.save(name, clean, set_active=body.set_active)
    return {"message": "Configuration saved", "provider_type": name, "active": settings.active() == name,
            "version": version, "config": settings.redacted(name), "test": test}


def _isolation_allowed(request: Request, names: list[str]) -> None:
    """400 before anything is stored when this service refuses providers without isolation."""
    check = getattr(services(request).providers, "check_isolation", None)
    if check is not None:
        for name in names:
            check(name)


def _with_defaults(name: str, clean: dict[str, Any]) -> dict[str, Any]:
    from ...providers.schema import validate_against_schema

    full, _ = validate_against_schema(registry.get_provider_class(name).get_config_schema(), clean)
    return full


@router.post("/test")
def test_connection(body: TestBody, request: Request, _: Principal = Depends(require_admin)) -> dict[str, Any]:
    """Really run a probe program on the provider built from this config (nothing is stored)."""
    settings = sandbox_settings(request)
    name = _known(body.provider_type)
    clean = settings.validate(name, body.config)
    return probe(name, _with_defaults(name, clean))


@router.put("/active")
def set_active(body: ActiveBody, request: Request, _: Principal = Depends(require_admin)) -> dict[str, Any]:
    """Switch the active provider: 400 unknown, 409 not configured."""
    settings = sandbox_settings(request)
    _isolation_allowed(request, [body.provider])
    version = settings.set_active(body.provider)
    return {"message": "Active provider updated", "active": body.provider, "version": version}


@router.get("/fallback")
def get_fallback(request: Request, _: Principal = Depends(require_admin)) -> dict[str, Any]:
    return {"providers": sandbox_settings(request).fallback()}


@router.put("/fallback")
def set_fallback(body: FallbackBody, request: Request, _: Principal = Depends(require_admin)) -> dict[str, Any]:
    """Ordered providers to try when the active one fails with SB003/SB009."""
    settings = sandbox_settings(request)
    _isolation_allowed(request, body.providers)
    version = settings.set_fallback(body.providers)
    return {"message": "Fallback updated", "providers": settings.fallback(), "version": version}


@router.get("/status")
def status(request: Request, _: Principal = Depends(require_admin)) -> dict[str, Any]:
    """What this process serves right now: the provider current() returns, its health, versions."""
    svc = services(request)
    holder = svc.providers
    out: dict[str, Any] = {"configured_active": sandbox_settings(request).active(),
                           "store": {"url": svc.store.url, "ok": svc.store.ping()}}
    try:
        provider = holder.current()
        out["serving"] = {"provider": provider.name, "isolation": str(getattr(provider.isolation, "value", "")),
                          "healthy": bool(provider.health_check())}
    except SandboxError as e:
        out["serving"] = None
        out["error"] = {"code": e.code, "message": e.message}
    for attr in ("version", "selection_note", "reloads"):
        if hasattr(holder, attr):
            out[attr] = getattr(holder, attr)
    if hasattr(holder, "retired"):
        out["retired_providers"] = [p.name for p in holder.retired()]
    return out


AUDIT_MAX_LIMIT = 1000
MAX_ENTRY_ID = 2**63 - 1
"""Audit ids are BIGINT: a larger one is a 400 naming the parameter, not a driver overflow (500)."""


@router.get("/audit")
def audit(request: Request, limit: int = 100,
          tenant_id: str | None = Query(None, pattern=NAME_PATTERN, max_length=64),
          before_id: int | None = Query(None, ge=1, le=MAX_ENTRY_ID),
          since: float | None = None, until: float | None = None,
          _: Principal = Depends(require_admin)) -> dict[str, Any]:
    """Newest audit entries first, without the code (``has_code`` says whether a row has it:
    SANDBOX_AUDIT_CODE; GET /audit/{id} returns it), so a page stays small whatever was run.
    ``next_before_id`` pages back; ``since``/``until`` (epoch seconds) bound the time."""
    if not 1 <= limit <= AUDIT_MAX_LIMIT:
        raise InvalidConfigError("limit must be between 1 and 1000", details={"fields": {"limit": "1..1000"}})
    for name, value in (("since", since), ("until", until)):
        if value is not None and not math.isfinite(value):
            raise InvalidConfigError(f"{name} must be a time in epoch seconds", details={"fields": {name: "finite"}})
    if since is not None and until is not None and since > until:
        raise InvalidConfigError("since must not be after until", details={"fields": {"since": "<= until"}})
    rows = services(request).store.audit.list(limit=limit, tenant_id=tenant_id, before_id=before_id,
                                              since=since, until=until, include_code=False)
    return {"data": rows, "next_before_id": rows[-1]["id"] if len(rows) == limit else None}


@router.get("/audit/{entry_id}")
def audit_entry(request: Request, entry_id: int = Path(ge=1, le=MAX_ENTRY_ID),
                _: Principal = Depends(require_admin)) -> dict[str, Any]:
    """One audit entry with its code (null unless SANDBOX_AUDIT_CODE was on when it ran)."""
    row = services(request).store.audit.get(entry_id)
    if row is None:
        raise InvalidConfigError(f"no audit entry {entry_id}", details={"id": entry_id}, http_status=404)
    return {"data": row}
