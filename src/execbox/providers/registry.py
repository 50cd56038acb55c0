"""Provider discovery (entry-point group ``execbox.providers``) and the ProviderManager.

Built-in providers are registered in pyproject.toml exactly like third-party ones, so a plugin
package adds a backend by declaring an entry point; nothing here names a backend.
"""

from __future__ import annotations

import logging
import threading
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from ..errors import InvalidConfigError, ProviderNotInitializedError, ProviderUnavailableError
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

    Only self-hosted providers that need no configuration are eligible for zero-config.
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
    raise ProviderUnavailableError("no sandbox provider is usable on this host",
                                   details={"reasons": reasons})


class ProviderManager:
    """Holds the active provider (and fallbacks) and swaps them safely at runtime.

    A swap never disturbs in-flight executions: callers hold a reference to the provider
    object they started on; the old provider is shut down only when released.
    """

    def __init__(self, provider: SandboxProvider | None = None,
                 fallbacks: list[SandboxProvider] | None = None) -> None:
        self._provider = provider
        self._fallbacks = list(fallbacks or [])
        self._lock = threading.RLock()
        self.selection_note: str | None = None

    def get_provider(self) -> SandboxProvider:
        with self._lock:
            if self._provider is None:
                raise ProviderNotInitializedError(
                    "no sandbox provider is configured; set SANDBOX_TYPE or configure one in the admin console")
            return self._provider

    def get_provider_name(self) -> str | None:
        return self._provider.name if self._provider else None

    def set_provider(self, provider: SandboxProvider) -> SandboxProvider | None:
        """Make ``provider`` active; return the previous one (caller decides when to shut it down)."""
        with self._lock:
            old, self._provider = self._provider, provider
            return old

    def set_fallbacks(self, providers: list[SandboxProvider]) -> None:
        with self._lock:
            self._fallbacks = list(providers)

    def candidates(self) -> list[SandboxProvider]:
        """Active provider first, then healthy fallbacks in order."""
        with self._lock:
            return [p for p in [self._provider, *self._fallbacks] if p is not None]

    def shutdown(self) -> None:
        with self._lock:
            for p in self.candidates():
                try:
                    p.shutdown()
                except Exception:  # noqa: BLE001
                    log.exception("shutting down %s failed", p.name)
            self._provider = None
            self._fallbacks = []
