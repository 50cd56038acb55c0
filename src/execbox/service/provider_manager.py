"""The active sandbox provider, read from the settings store, hot-reloaded, with fallback.

Hot reload: every ``current()`` runs one indexed query (``max(update_time)``; optionally
throttled by ``check_interval``) and rebuilds a provider only when its stored name or config
changed, so a change made by any process reaches every process at its next execution.
In-flight work keeps the provider object it started on: a replaced provider is shut down only
once it has no leases and no live instances (sessions, running one-shot executions), after a
short grace period.

Fallback: ``run_with_fallback(fn)`` tries the active provider, then ``sandbox.fallback`` in
order, moving on while the failure is SB003/SB009 (connection failed / provider unavailable)
or the provider cannot be built; it reports which provider served and what was tried.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from ..errors import InvalidConfigError, ProviderUnavailableError, SandboxError
from ..providers import registry
from ..providers.base import Isolation, SandboxProvider
from .crypto import KeyRing
from .store import Store
from .store.sandbox_seed import warn_ignored_on_later_boot
from .store.sandbox_settings import SandboxSettings

log = logging.getLogger("execbox.providers")
T = TypeVar("T")

FALLBACK_CODES = frozenset({"SB003", "SB009"})
BUILD_RETRY_SECONDS = 5.0
UNHEALTHY_SECONDS = 10.0
HEALTH_EVERY = 5.0


def no_isolation_problem(name: str, why: str) -> str:
    return (f"provider {name!r} has no isolation; refusing to serve it ({why}). Bind 127.0.0.1, configure an "
            "isolating provider (SANDBOX_TYPE=jail), or start the service with --allow-no-isolation")


@dataclass
class _Built:
    name: str
    fingerprint: str
    provider: SandboxProvider | None
    error: SandboxError | None = None
    built_at: float = field(default_factory=time.monotonic)


@dataclass
class _Retired:
    provider: SandboxProvider
    since: float


def _fingerprint(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


class ProviderManager:
    """Holds the providers built from the store (``Services.providers``)."""

    def __init__(self, store: Store, *, keyring: KeyRing | None = None, env: Mapping[str, str] | None = None,
                 seed_file: Path | None = None, seed: bool = True, check_interval: float | None = None,
                 retire_grace: float = 2.0, no_isolation_refused: str | None = None) -> None:
        """``no_isolation_refused``: why a provider without isolation (local) may not serve here
        (``execbox serve`` on a non-loopback address without --allow-no-isolation); None allows it."""
        self.store = store
        self.no_isolation_refused = no_isolation_refused
        self.settings = SandboxSettings(store, keyring)
        env = os.environ if env is None else env
        if check_interval is None:
            check_interval = float(env.get("EXECBOX_CONFIG_CHECK_INTERVAL", "0") or 0)
        self.check_interval = check_interval
        self.retire_grace = retire_grace
        self.selection_note: str | None = None
        if seed and not self.settings.seed(seed_file, env):
            warn_ignored_on_later_boot(env, self.settings.active())
        self._lock = threading.RLock()
        self._version: float | None = None
        self._checked_at = 0.0
        self._db_warned = 0.0
        self._active_name: str | None = None
        self._active_error: SandboxError | None = None
        self._fallback_names: list[str] = []
        self._built: dict[str, _Built] = {}
        self._leases: dict[int, int] = {}
        self._retired: list[_Retired] = []
        self._unhealthy: dict[str, float] = {}
        self._health_checked: dict[str, float] = {}
        self._sweeper: threading.Timer | None = None
        self._closed = False
        self.reloads = 0

    # -- hot reload -----------------------------------------------------------------------------
    @property
    def version(self) -> float:
        """The settings version the providers were last built from."""
        return self._version or 0.0

    def refresh(self, force: bool = False) -> bool:
        """Re-read the store if its version moved; True when something was rebuilt or re-read."""
        now = time.monotonic()
        if not force and self._version is not None and now - self._checked_at < self.check_interval:
            return False
        try:
            version = self.store.settings.version()
        except SQLAlchemyError as e:
            if self._version is None:
                raise ProviderUnavailableError(
                    f"settings database {self.store.url} is unreachable: {type(e).__name__}",
                    details={"database": self.store.url}) from None
            # Keep serving what was loaded: a database outage must not stop executions.
            if now - self._db_warned > 30:
                log.warning("settings database unreachable (%s); serving the last loaded configuration",
                            type(e).__name__)
                self._db_warned = now
            self._checked_at = now
            return False
        self._checked_at = now
        if not force and version == self._version:
            return False
        with self._lock:
            if not force and version == self._version:
                return False
            self._version = version
            self._load()
            self.reloads += 1
            return True

    def _load(self) -> None:
        active = self.settings.active()
        if active is None:
            try:
                active, reasons = registry.strongest_available()
                self.selection_note = (f"zero-config picked {active}" +
                                       (f"; skipped: {reasons}" if reasons else ""))
            except SandboxError as e:
                self._active_name = None
                self._active_error = e
                self._fallback_names = self.settings.fallback()
                return
        else:
            self.selection_note = None
        self._active_error = None
        self._active_name = active
        self._fallback_names = [n for n in self.settings.fallback() if n != active]
        wanted = [active, *self._fallback_names]
        for name in list(self._built):
            if name not in wanted:
                self._retire(self._built.pop(name))
        for name in wanted:
            b = self._built.get(name)
            if b is None:
                continue
            try:
                fp = _fingerprint(self.settings.effective(name))
            except SandboxError:
                fp = "invalid"
            if fp != b.fingerprint:
                self._retire(self._built.pop(name))

    def _build(self, name: str) -> _Built:
        """The built provider for ``name`` (built on first use; a failure is cached briefly)."""
        with self._lock:
            b = self._built.get(name)
            if b is not None and (b.provider is not None or time.monotonic() - b.built_at < BUILD_RETRY_SECONDS):
                return b
            fp = "invalid"
            try:
                self.check_isolation(name, ProviderUnavailableError)
                config = self.settings.effective(name)
                fp = _fingerprint(config)
                provider = registry.create_provider(name, config)
                b = _Built(name, fp, provider)
                log.info("provider %s built (settings version %s)", name, self._version)
            except SandboxError as e:
                log.warning("provider %s could not be built: %s", name, e)
                b = _Built(name, fp, None, e)
            except Exception as e:  # noqa: BLE001 - a broken backend must surface as SB009, not 500
                log.exception("provider %s failed to build", name)
                b = _Built(name, fp, None, ProviderUnavailableError(
                    f"provider {name!r} failed to start: {type(e).__name__}: {e}", details={"provider": name}))
            self._built[name] = b
            return b

    def check_isolation(self, name: str, error: type[SandboxError] = InvalidConfigError) -> None:
        """Refuse a provider without isolation where the service was told to (see __init__). Checked
        when one is activated or listed as a fallback (admin API) and whenever one is built, so no
        path (the console, ``execbox config activate``, a fallback, zero-config selection) switches
        a public service to running code as its own user."""
        if self.no_isolation_refused is None:
            return
        try:
            isolation = Isolation(registry.get_provider_class(name).isolation)
        except SandboxError:
            return  # an unknown name fails where it is used, with its own error
        if isolation == Isolation.NONE:
            raise error(no_isolation_problem(name, self.no_isolation_refused),
                        details={"provider": name, "isolation": isolation.value})

    def _get(self, name: str) -> SandboxProvider:
        b = self._build(name)
        if b.provider is None:
            assert b.error is not None
            raise b.error
        return b.provider

    # -- what the service uses --------------------------------------------------------------------
    def current(self) -> SandboxProvider:
        """The provider the next execution should use (hot-reloaded).

        Without fallbacks: the active provider, or its SB error. With fallbacks: the first
        candidate that builds and is healthy (health checked at most every HEALTH_EVERY
        seconds, failures reported by run_with_fallback count too); never a silent switch
        when no fallback is configured.
        """
        self.refresh()
        self._sweep()
        with self._lock:
            active, fallbacks, error = self._active_name, list(self._fallback_names), self._active_error
        if not fallbacks:
            if active is None:
                raise error or ProviderUnavailableError("no sandbox provider is usable")
            return self._get(active)
        first_error: SandboxError | None = error
        built: SandboxProvider | None = None
        for name in [n for n in [active, *fallbacks] if n]:
            try:
                provider = self._get(name)
            except SandboxError as e:
                first_error = first_error or e
                continue
            built = built or provider
            if self._healthy(name, provider):
                if name != active:
                    log.warning("active provider %s is unhealthy; serving with fallback %s", active, name)
                return provider
        if built is not None:
            return built  # nothing healthy: let the active one report its own error
        raise first_error or ProviderUnavailableError("no sandbox provider is usable")

    def _healthy(self, name: str, provider: SandboxProvider) -> bool:
        now = time.monotonic()
        if self._unhealthy.get(name, 0) > now:
            return False
        checked = self._health_checked.get(name)
        if checked is not None and now - checked < HEALTH_EVERY:
            return True
        try:
            ok = bool(provider.health_check())
        except Exception:  # noqa: BLE001
            ok = False
        self._health_checked[name] = now
        if not ok:
            self.mark_unhealthy(name, HEALTH_EVERY)
        return ok

    @property
    def active_name(self) -> str | None:
        self.refresh()
        return self._active_name

    def candidate_names(self) -> list[str]:
        """Active first, then fallbacks; providers that just failed go last."""
        self.refresh()
        with self._lock:
            names = [n for n in [self._active_name, *self._fallback_names] if n]
        now = time.monotonic()
        healthy = [n for n in names if self._unhealthy.get(n, 0) <= now]
        return healthy + [n for n in names if n not in healthy]

    def candidates(self) -> list[SandboxProvider]:
        """Every candidate that can be built, active first."""
        out = []
        for name in self.candidate_names():
            try:
                out.append(self._get(name))
            except SandboxError:
                continue
        return out

    def acquire(self, provider: SandboxProvider | None = None) -> SandboxProvider:
        """Pin a provider (default: the current one) until ``release``: it will not be shut down."""
        provider = provider or self.current()
        with self._lock:
            self._leases[id(provider)] = self._leases.get(id(provider), 0) + 1
        return provider

    def release(self, provider: SandboxProvider) -> None:
        with self._lock:
            left = self._leases.get(id(provider), 1) - 1
            if left > 0:
                self._leases[id(provider)] = left
            else:
                self._leases.pop(id(provider), None)
        self._sweep()

    @contextmanager
    def lease(self, provider: SandboxProvider | None = None) -> Iterator[SandboxProvider]:
        p = self.acquire(provider)
        try:
            yield p
        finally:
            self.release(p)

    def mark_unhealthy(self, name: str, seconds: float = UNHEALTHY_SECONDS) -> None:
        self._unhealthy[name] = time.monotonic() + seconds
        self._health_checked.pop(name, None)

    def run_with_fallback(self, fn: Callable[[SandboxProvider], T]) -> tuple[T, str, list[dict[str, Any]]]:
        """Call ``fn(provider)`` on each candidate while it fails with SB003/SB009 (or cannot be
        built). Returns (value, name of the provider that served, what was tried before)."""
        tried: list[dict[str, Any]] = []
        last: SandboxError | None = None
        for name in self.candidate_names():
            try:
                provider = self._get(name)
            except SandboxError as e:
                tried.append({"provider": name, "code": e.code, "message": e.message})
                last = e
                continue
            with self.lease(provider):
                try:
                    value = fn(provider)
                except SandboxError as e:
                    if e.code not in FALLBACK_CODES:
                        raise
                    self.mark_unhealthy(name)
                    tried.append({"provider": name, "code": e.code, "message": e.message})
                    last = e
                    continue
            self._unhealthy.pop(name, None)
            self._health_checked[name] = time.monotonic()
            return value, name, tried
        if last is None:
            last = ProviderUnavailableError("no sandbox provider is configured or usable")
        last.details = {**last.details, "tried": tried}
        raise last

    # -- retiring replaced providers --------------------------------------------------------------
    def _retire(self, b: _Built) -> None:
        if b.provider is not None:
            log.info("provider %s replaced; shutting it down once its in-flight work ends", b.name)
            self._retired.append(_Retired(b.provider, time.monotonic()))
            self._arm_sweeper()

    def _arm_sweeper(self) -> None:
        if self._sweeper is None and not self._closed:
            self._sweeper = threading.Timer(max(0.2, min(self.retire_grace, 1.0)), self._sweep_tick)
            self._sweeper.daemon = True
            self._sweeper.start()

    def _sweep_tick(self) -> None:
        self._sweeper = None
        self._sweep()
        with self._lock:
            if self._retired:
                self._arm_sweeper()

    @staticmethod
    def _busy(provider: SandboxProvider) -> bool:
        list_instances = getattr(provider, "list_instances", None)
        if list_instances is None:
            return False
        try:
            return bool(list_instances())
        except Exception:  # noqa: BLE001
            return False

    def in_flight(self, provider: SandboxProvider) -> bool:
        return self._leases.get(id(provider), 0) > 0 or self._busy(provider)

    def _sweep(self) -> None:
        if not self._retired:
            return
        now = time.monotonic()
        done: list[SandboxProvider] = []
        with self._lock:
            keep = []
            for r in self._retired:
                # Without list_instances we cannot see running work: wait a long execution out.
                grace = self.retire_grace if hasattr(r.provider, "list_instances") else max(
                    self.retire_grace, 300.0)
                if now - r.since >= grace and not self.in_flight(r.provider):
                    done.append(r.provider)
                else:
                    keep.append(r)
            self._retired = keep
        for p in done:
            try:
                p.shutdown()
                log.info("retired provider %s shut down", p.name)
            except Exception:  # noqa: BLE001
                log.exception("shutting down retired provider %s failed", p.name)

    def retired(self) -> list[SandboxProvider]:
        return [r.provider for r in self._retired]

    def shutdown(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        with self._lock:
            providers = [b.provider for b in self._built.values() if b.provider is not None]
            providers += [r.provider for r in self._retired]
            self._built.clear()
            self._retired.clear()
        for p in providers:
            try:
                p.shutdown()
            except Exception:  # noqa: BLE001
                log.exception("shutting down %s failed", p.name)
