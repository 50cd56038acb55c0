"""Provider discovery (entry-point group ``execbox.providers``) and selection.

The service's active provider (hot reload, fallback) lives in service/provider_manager.py.

Built-in providers are registered in pyproject.toml exactly like third-party ones, so a plugin
package adds a backend by declaring an entry point; nothing here names a backend.
"""

from __future__ import annotations

import logging
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from ..errors import InvalidConfigError, ProviderUnavailableError
from ..models import TIER_ORDER, Isolation
from .base import SandboxProvider

log = logging.getLogger("execbox.registry")
GROUP = "execbox.providers"


@cache
def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def provider_names() -> list[str]:
    return sorted(_entry_points())


def get_provider_class(name: str) -> type[SandboxProvider]:
    eps = _entry_points()
    ep = eps.get(name)
    if ep is None:
        raise InvalidConfigError(
            f"unknown provider {name!r}; installed providers: {', '.join(sorted(eps)) or 'none'}",
            details={"field": "provider", "value": name, "known": sorted(eps)},
        )
    try:
        cls = ep.load()
    except ImportError as e:
        raise ProviderUnavailableError(
            f"provider {name!r} is not available in this installation: {e}",
            details={"provider": name, "missing": getattr(e, "name", None) or str(e)},
        ) from e
    if not (isinstance(cls, type) and issubclass(cls, SandboxProvider)):
        raise InvalidConfigError(f"entry point {name!r} does not name a SandboxProvider subclass")
    return cls


def provider_classes() -> dict[str, type[SandboxProvider]]:
    out = {}
    for name in provider_names():
        try:
            out[name] = get_provider_class(name)
        except Exception as e:  # noqa: BLE001 - a broken plugin must not hide the others
            log.warning("provider %s failed to load: %s", name, e)
    return out


def create_provider(name: str, config: dict[str, Any] | None = None) -> SandboxProvider:
    provider = get_provider_class(name)()
    provider.initialize(config or {})
    return provider


def strongest_available(eligible: list[str] | None = None) -> tuple[str, dict[str, str]]:
    """The provider with the strongest isolation tier usable here, and why others were skipped.

    Only self-hosted providers that need no configuration and isolate are eligible: a caller who
    asked for nothing never gets ``local`` (no isolation) because the jail could not start.
    """
    reasons: dict[str, str] = {}
    classes = provider_classes()
    candidates = [(n, c) for n, c in classes.items() if c.zero_config]
    if eligible is not None:
        candidates = [(n, c) for n, c in candidates if n in eligible]
    candidates.sort(key=lambda nc: TIER_ORDER.index(Isolation(nc[1].isolation)))
    for name, cls in candidates:
        ok, reason = cls.availability()
        if ok:
            return name, reasons
        reasons[name] = reason
    if not classes:  # nothing registered at all: the package's metadata is missing, not a host problem
        why = (f"no providers are registered under the entry-point group {GROUP!r}; is execbox installed "
               "(pip install -e .) rather than run from its source tree?")
    else:
        why = "; ".join(f"{name}: {reason}" for name, reason in reasons.items()) or "none eligible"
    raise ProviderUnavailableError(
        f"no sandbox provider is usable on this host ({why}). For development without isolation, "
        "choose one explicitly: SANDBOX_TYPE=local", details={"reasons": reasons})
