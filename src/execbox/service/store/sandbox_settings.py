"""Sandbox provider configuration as stored rows: seed, validate, encrypt, redact.

Rows (the seed's keys): ``sandbox.provider_type`` (string; empty = zero-config), one JSON row
per provider ``sandbox.<provider>`` holding only the values an operator set (schema defaults are
applied on read, so a new default reaches existing installs), and ``sandbox.fallback`` (JSON
list). ``secret: true`` fields are stored as AES-256-GCM ciphertext (``execbox.service.crypto``)
and leave this module only decrypted for a provider, or redacted for people.

What the first boot writes comes from sandbox_seed.py; how secret fields are shown, kept and
checked (printable ASCII: they are HTTP header values) from secret_fields.py.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ...errors import InvalidConfigError
from ...providers import registry
from ...providers.base import SandboxProvider
from ...providers.schema import cross_field_errors, validate_against_schema
from ..crypto import (
    KEY_FILE,
    PENDING_KEY_FILE,
    PREVIOUS_KEY_FILE,
    KeyRing,
    SecretKeyError,
    ciphertext_key_id,
    is_encrypted,
    load_keyring,
)
from .engine import Store
from .models import SystemSetting
from .repos import SettingsRepo, _lock_for_write
from .sandbox_seed import (  # noqa: F401 - the row names, re-exported
    ACTIVE,
    FALLBACK,
    PREFIX,
    checked_first_boot,
    first_boot_rows,
    provider_schema,
    schema_or_none,
    setting_name,
)
from .secret_fields import (  # noqa: F401 - moved_destinations, shown_secret, STRUCTURED_SECRETS: re-exported
    STRUCTURED_SECRETS,
    moved_destinations,
    resolve_secrets,
    shown_secret,
    stored_secret_problems,
)

log = logging.getLogger("execbox.config")


def _field_for_message(message: str, schema: Mapping[str, Any]) -> str:
    """Attribute a validate_config message to the field it starts with, if any."""
    head = message.replace(":", " ").split(" ", 1)[0].strip()
    return head if head in schema else "config"


def _key_source_identity(data_dir: Path) -> tuple[Any, ...]:
    """What the key ring is loaded from, cheaply: the key env vars, and the identity (inode,
    size, times) of each key file. A rotation replaces key files by rename (a new inode), so
    any change shows here; three stat calls per use."""
    out: list[Any] = [os.environ.get("EXECBOX_SECRET_KEY", ""), os.environ.get("EXECBOX_SECRET_KEY_PREVIOUS", "")]
    for name in (KEY_FILE, PENDING_KEY_FILE, PREVIOUS_KEY_FILE):
        try:
            st = os.stat(Path(data_dir) / name)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


class SandboxSettings:
    """The provider rows of the store, with secrets encrypted at rest.

    The key ring follows the key files: every use of :attr:`keyring` checks them (one stat each)
    and reloads when one changed, so after ``execbox secrets rotate`` a running process
    encrypts, and derives E2B access tokens, under the new key at once, while the replaced key
    (``secret.key.previous``) still decrypts and still opens the tokens made under it."""

    def __init__(self, store: Store, keyring: KeyRing | None = None) -> None:
        self.store = store
        self._keyring = keyring
        self._keyring_fixed = keyring is not None
        self._loaded: tuple[tuple[Any, ...], KeyRing] | None = None  # (key source identity, ring)

    @property
    def keyring(self) -> KeyRing:
        if self._keyring_fixed:
            assert self._keyring is not None
            return self._keyring
        identity = _key_source_identity(self.store.data_dir)  # before loading: a change meanwhile reloads next time
        loaded = self._loaded
        if loaded is None or loaded[0] != identity:
            loaded = (identity, load_keyring(self.store.data_dir, needed=self.key_ids_in_use()))
            self._loaded = loaded  # one assignment: threads see an identity with its own ring
        return loaded[1]

    def key_ids_in_use(self) -> set[str]:
        """The ids of the keys the stored secrets are encrypted with."""
        ids: set[str] = set()
        for name, rec in self.store.settings.all().items():
            if not name.startswith(PREFIX):
                continue
            try:
                value = json.loads(rec.value)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                ids.update(k for k in (ciphertext_key_id(v) for v in value.values() if isinstance(v, str)) if k)
        e2b = getattr(self.store, "e2b", None)  # E2B sandboxes' env vars (e2b_compat/persist.py)
        if e2b is not None:
            ids.update(k for k in (ciphertext_key_id(v) for _, v in e2b.encrypted()) if k)
        return ids

    # -- first boot ------------------------------------------------------------------------
    def seed(self, seed_file: Path | None = None, env: Mapping[str, str] | None = None) -> bool:
        """On a store without ``sandbox.provider_type``: write the seed file's rows with the env
        overrides applied (sandbox_seed.py), secrets encrypted. Each provider's configuration
        passes :meth:`problems` (the admin API's validation) first: a value that cannot be used is
        SB002 naming the variable (or seed row) it came from, and nothing is written. Returns False
        (and writes nothing) on any later boot."""
        env = os.environ if env is None else env
        if self.store.settings.get(ACTIVE) is not None:
            return False
        values, types, configs, sources = first_boot_rows(seed_file, env)
        configs = checked_first_boot(configs, sources, lambda p, c: self.problems(p, c, lambda: {}))
        for provider, cfg in configs.items():
            values[setting_name(provider)] = json.dumps(self._encrypt(provider, cfg, schema_or_none(provider) or {}))
        return self.store.settings.seed(values, source="seed", data_types=types)

    # -- reading ---------------------------------------------------------------------------
    def active(self) -> str | None:
        value = (self.store.settings.get(ACTIVE) or "").strip()
        return value or None

    def fallback(self) -> list[str]:
        raw = self.store.settings.get(FALLBACK)
        try:
            names = json.loads(raw) if raw else []
        except json.JSONDecodeError:
            log.warning("%s is not a JSON list; ignoring it", FALLBACK)
            return []
        return [n for n in names if isinstance(n, str)]

    def stored(self, provider: str) -> dict[str, Any] | None:
        """The row as stored (secrets still encrypted), or None when never configured."""
        raw = self.store.settings.get(setting_name(provider))
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise InvalidConfigError(f"stored {setting_name(provider)} is not valid JSON",
                                     details={"field": setting_name(provider)}) from None
        return value if isinstance(value, dict) else {}

    def is_configured(self, provider: str) -> bool:
        return self.store.settings.get(setting_name(provider)) is not None

    def decrypted(self, provider: str) -> dict[str, Any]:
        """Stored values with secrets in clear: what a provider is initialized with."""
        stored = self.stored(provider) or {}
        return {k: self._decrypt(v, f"{setting_name(provider)}.{k}") if is_encrypted(v) else v
                for k, v in stored.items()}

    def _decrypt(self, value: str, aad: str) -> str:
        try:
            return self.keyring.decrypt(value, aad)
        except SecretKeyError as e:
            # Another process may have rotated the key file since we loaded it: reload once.
            if "key_id" not in e.details or "configured_key_id" not in e.details or self._keyring_fixed:
                raise
            identity = _key_source_identity(self.store.data_dir)
            self._loaded = (identity, load_keyring(self.store.data_dir, create=False))
            return self._loaded[1].decrypt(value, aad)

    def effective(self, provider: str) -> dict[str, Any]:
        """Schema defaults overlaid with stored values (unknown stored fields dropped)."""
        schema = provider_schema(provider)
        stored = {k: v for k, v in self.decrypted(provider).items() if k in schema}
        clean, errors = validate_against_schema(schema, stored)
        if errors:
            raise InvalidConfigError(
                f"stored {provider} configuration is invalid: "
                + "; ".join(f"{k}: {v}" for k, v in errors.items()),
                details={"provider": provider, "fields": errors})
        return clean

    def redacted(self, provider: str) -> dict[str, Any]:
        """For people: stored values or schema defaults, secrets as '****' + last 4."""
        schema = provider_schema(provider)
        values = {k: spec.get("default", "") for k, spec in schema.items()}
        values.update({k: v for k, v in self.decrypted(provider).items() if k in schema})
        for k, spec in schema.items():
            if spec.get("secret"):
                values[k] = shown_secret(k, values.get(k) or "")
        return values

    # -- writing ---------------------------------------------------------------------------
    def validate(self, provider: str, config: Any) -> dict[str, Any]:
        """Schema, the cross-field rules (``timeout`` <= ``max_timeout``) and validate_config, with
        redacted (or omitted) secrets resolved to the stored ones while every ``secret_destination``
        field (endpoint, API URL, domain) keeps its stored value; after such a change the secret
        must be sent again (SB002 "re-enter api_key when endpoint changes"), so a stored secret is
        never sent somewhere new.

        Returns the values to store (only what was given); raises SB002 with details.fields.
        """
        if not isinstance(config, dict):
            raise InvalidConfigError("config must be a JSON object",
                                     details={"provider": provider, "fields": {"config": "must be a JSON object"}})
        clean, errors = self.problems(provider, config)
        if errors:
            summary = "; ".join(f"{k}: {v}" for k, v in errors.items())
            raise InvalidConfigError(f"invalid {provider} configuration: {summary}",
                                     details={"provider": provider, "fields": errors})
        return clean

    def problems(self, provider: str, config: dict[str, Any],
                 load_stored: Any = None) -> tuple[dict[str, Any], dict[str, str]]:
        """What :meth:`validate` checks, without raising: ``(clean values, {field: error})``.
        ``load_stored``: the stored secrets a redacted or omitted one resolves to (default: this
        provider's row; the first boot passes ``lambda: {}``)."""
        cls = registry.get_provider_class(provider)
        schema = cls.get_config_schema()
        config = dict(config)
        errors = resolve_secrets(schema, config, load_stored or (lambda: self.decrypted(provider)))
        clean, schema_errors = validate_against_schema(schema, config, fill_defaults=False)
        errors = {**schema_errors, **errors}  # "re-enter api_key ..." says more than "is required"
        full, _ = validate_against_schema(schema, clean)  # the merged config: what a run would see
        for field, problem in cross_field_errors(full).items():
            errors.setdefault(field, problem)
        if not errors:
            ok, message = cls().validate_config(full)
            if not ok:
                errors[_field_for_message(message or "", schema)] = message or "rejected by the provider"
        return clean, errors

    def _encrypt(self, provider: str, values: dict[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(values)
        for k, spec in schema.items():
            v = out.get(k)
            if spec.get("secret") and isinstance(v, str) and v and not is_encrypted(v):
                out[k] = self.keyring.encrypt(v, f"{setting_name(provider)}.{k}")
        return out

    def save(self, provider: str, clean: dict[str, Any], set_active: bool = False) -> float:
        """Store validated values (secrets encrypted), optionally activating the provider, in
        one transaction."""
        row = json.dumps(self._encrypt(provider, clean, provider_schema(provider)), sort_keys=True)
        values = {setting_name(provider): row}
        types = {setting_name(provider): "json"}
        if set_active:
            values[ACTIVE] = provider
            types[ACTIVE] = "string"
        return self.store.settings.set_many(values, data_types=types)

    def set_active(self, provider: str) -> float:
        if provider not in registry.provider_names():
            raise InvalidConfigError(
                f"unknown provider {provider!r}; installed: {', '.join(registry.provider_names())}",
                details={"fields": {"provider": "unknown provider"}, "known": registry.provider_names()})
        if not self.is_configured(provider):
            raise InvalidConfigError(
                f"provider {provider!r} is not configured; save its configuration first",
                details={"fields": {"provider": "not configured"}}, http_status=409)
        try:
            self.check_stored(provider)
        except InvalidConfigError as e:
            raise InvalidConfigError(
                f"provider {provider!r} is not configured correctly: {e.message}",
                details={"fields": {"provider": "not configured"}, "config_errors": e.details.get("fields", {})},
                http_status=409) from None
        return self.store.settings.set(ACTIVE, provider, data_type="string")

    def check_stored(self, provider: str) -> dict[str, Any]:
        """The stored configuration (defaults applied) if it passes everything a new one must: the
        schema, the cross-field rules and the secrets' own check (a row saved before them may hold
        ``timeout`` above ``max_timeout``, or a secret with a newline) and the provider's
        ``validate_config``; SB002 naming the fields otherwise. Activation asks this: a provider
        that could not serve one request is never made the active one."""
        full = self.effective(provider)
        schema = provider_schema(provider)
        errors = {**cross_field_errors(full), **stored_secret_problems(schema, full)}
        if not errors:
            ok, message = registry.get_provider_class(provider)().validate_config(full)
            if not ok:
                errors[_field_for_message(message or "", schema)] = message or "rejected by the provider"
        if errors:
            raise InvalidConfigError("; ".join(f"{k}: {v}" for k, v in errors.items()),
                                     details={"provider": provider, "fields": errors})
        return full

    def set_fallback(self, providers: Any) -> float:
        if not isinstance(providers, list) or not all(isinstance(p, str) for p in providers):
            raise InvalidConfigError("fallback must be a list of provider names",
                                     details={"fields": {"providers": "must be a list of strings"}})
        known = registry.provider_names()
        errors = {}
        for i, p in enumerate(providers):
            if p not in known:
                errors[f"providers[{i}]"] = f"unknown provider {p!r}"
            elif providers.index(p) != i:
                errors[f"providers[{i}]"] = f"{p!r} is listed twice"
        if errors:
            raise InvalidConfigError("invalid fallback list: " + "; ".join(errors.values()),
                                     details={"fields": errors, "known": known})
        return self.store.settings.set(FALLBACK, json.dumps(providers))

    def reencrypt_all(self, new: KeyRing) -> int:
        """Re-encrypt every stored secret, the provider rows' and the E2B sandboxes' env vars,
        under ``new`` in one transaction (all or nothing: a crash leaves every row as it was);
        returns the count. Any key at hand decrypts (the key ring's, and ``new``'s); a value
        none of them can decrypt fails the whole transaction with SB002, changing nothing."""
        identity = _key_source_identity(self.store.data_dir)
        current = self.keyring
        ring = KeyRing(new.primary, new.source, [*new.others, current.primary, *current.others])
        count = 0

        def rewrite(name: str, raw: str) -> str | None:
            nonlocal count
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                return None
            if not isinstance(value, dict) or not any(is_encrypted(v) for v in value.values()):
                return None
            for k, v in list(value.items()):
                if is_encrypted(v):
                    aad = f"{name}.{k}"
                    value[k] = ring.encrypt(ring.decrypt(v, aad), aad)
                    count += 1
            return json.dumps(value, sort_keys=True)

        def env_vars(sandbox_id: str, value: str) -> str:
            aad = f"e2b_sandboxes.{sandbox_id}.env_vars"  # as e2b_compat/persist.py binds them
            return ring.encrypt(ring.decrypt(value, aad), aad)

        with Session(self.store.engine, expire_on_commit=False) as s, s.begin():
            _lock_for_write(s)  # first: SQLite takes its write lock before reading anything
            rows = s.scalars(select(SystemSetting).where(SystemSetting.name.startswith(PREFIX, autoescape=True)))
            types: dict[str, str] = {}
            changed: dict[str, str] = {}
            for row in rows:
                new_value = rewrite(row.name, row.value)
                if new_value is not None:
                    changed[row.name], types[row.name] = new_value, row.data_type
            if changed:
                SettingsRepo._write(s, changed, "admin", "json", types)  # bumps the version: replicas reload
            e2b = getattr(self.store, "e2b", None)
            if e2b is not None:
                count += e2b.reencrypt_env_vars(s, env_vars)
        if self._keyring_fixed:
            self._keyring = ring
        else:  # until a key file changes: the new key first, and every key it had still decrypts
            self._loaded = (identity, ring)
        return count


def instantiate(name: str, config: dict[str, Any]) -> SandboxProvider:
    return registry.create_provider(name, config)
