"""The provider rows' names, and what the first boot writes into them: the seed file's rows
(RAGFlow's ``conf/system_settings.json``) with the environment's overrides applied.

``SandboxSettings.seed`` (sandbox_settings.py) encrypts the secrets among them and writes them,
once per store.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import InvalidConfigError, SandboxError
from ...providers import registry
from ...settings import parse_duration, sandbox_type

log = logging.getLogger("execbox.config")

ACTIVE = "sandbox.provider_type"
FALLBACK = "sandbox.fallback"
PREFIX = "sandbox."
SEED_ENV = "EXECBOX_SEED_FILE"

# Env vars applied on first boot only: (provider, field). The field is applied when the provider's
# schema has it. Besides these, EXECBOX_<PROVIDER>_<FIELD> sets any schema field.
ENV_FIELDS: dict[str, tuple[str, str]] = {
    "E2B_API_KEY": ("e2b", "api_key"),
    "E2B_DOMAIN": ("e2b", "domain"),
    "E2B_TEMPLATE": ("e2b", "template"),
    "AGENTRUN_ACCESS_KEY_ID": ("aliyun_codeinterpreter", "access_key_id"),
    "AGENTRUN_ACCESS_KEY_SECRET": ("aliyun_codeinterpreter", "access_key_secret"),
    "AGENTRUN_ACCOUNT_ID": ("aliyun_codeinterpreter", "account_id"),
    "AGENTRUN_REGION": ("aliyun_codeinterpreter", "region"),
    "SANDBOX_EXECUTOR_ENDPOINT": ("self_managed", "endpoint"),
}


def setting_name(provider: str) -> str:
    return PREFIX + provider


def default_seed_file() -> Path | None:
    """EXECBOX_SEED_FILE, else conf/system_settings.json of the source tree or the working dir."""
    if os.environ.get(SEED_ENV):
        return Path(os.environ[SEED_ENV])
    for base in (Path(__file__).resolve().parents[4], Path.cwd()):
        path = base / "conf" / "system_settings.json"
        if path.is_file():
            return path
    return None


def read_seed(path: Path | None) -> dict[str, tuple[str, str]]:
    """{name: (data_type, value)} from a RAGFlow-style ``{"system_settings": [...]}`` file."""
    if path is None:
        return {ACTIVE: ("string", ""), FALLBACK: ("json", "[]")}
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InvalidConfigError(f"seed file {path} is unreadable: {e}", details={"path": str(path)}) from None
    out: dict[str, tuple[str, str]] = {}
    for row in doc.get("system_settings", []):
        value = row.get("value", "")
        if not isinstance(value, str):
            value = json.dumps(value)
        out[str(row["name"])] = (str(row.get("data_type", "string")), value)
    return out


def provider_schema(name: str) -> dict[str, dict[str, Any]]:
    return registry.get_provider_class(name).get_config_schema()


def schema_or_none(name: str) -> dict[str, dict[str, Any]] | None:
    try:
        return provider_schema(name)
    except SandboxError:
        return None


def first_boot_rows(seed_file: Path | None, env: Mapping[str, str]) -> tuple[
        dict[str, str], dict[str, str], dict[str, dict[str, Any]]]:
    """``(values, data_types, configs)``: the active and fallback rows, and each provider's
    configuration (only its schema's fields; secrets still in clear) from the seed file
    (default: :func:`default_seed_file`) with ``env`` applied."""
    rows = read_seed(seed_file if seed_file is not None else default_seed_file())
    configs: dict[str, dict[str, Any]] = {}
    for name, (_dt, value) in rows.items():
        if name.startswith(PREFIX) and name not in (ACTIVE, FALLBACK):
            try:
                parsed = json.loads(value or "{}")
            except json.JSONDecodeError:
                raise InvalidConfigError(f"seed row {name} is not JSON", details={"field": name}) from None
            configs[name[len(PREFIX):]] = {k: v for k, v in parsed.items() if v not in ("", None)}
    apply_env(configs, env)
    active = sandbox_type(env) or rows.get(ACTIVE, ("string", ""))[1]
    values: dict[str, str] = {ACTIVE: active, FALLBACK: rows.get(FALLBACK, ("json", "[]"))[1]}
    types = {ACTIVE: "string", FALLBACK: "json"}
    for provider, cfg in list(configs.items()):
        schema = schema_or_none(provider)
        if schema is not None:
            dropped = sorted(set(cfg) - set(schema))
            if dropped:
                log.info("seed: %s has no field(s) %s; ignored", provider, ", ".join(dropped))
            configs[provider] = {k: v for k, v in cfg.items() if k in schema}
        types[setting_name(provider)] = "json"
    return values, types, configs


def apply_env(configs: dict[str, dict[str, Any]], env: Mapping[str, str]) -> None:
    """SANDBOX_TIMEOUT_SEC, :data:`ENV_FIELDS` and EXECBOX_<PROVIDER>_<FIELD> into ``configs``."""
    timeout = env.get("SANDBOX_TIMEOUT_SEC", "").strip()
    if timeout:
        seconds = max(1, round(parse_duration(timeout, "SANDBOX_TIMEOUT_SEC")))
        for provider in registry.provider_names():
            schema = schema_or_none(provider) or {}
            if "timeout" in schema:
                configs.setdefault(provider, {})["timeout"] = seconds
    for var, (provider, fld) in ENV_FIELDS.items():
        if env.get(var, "").strip():
            configs.setdefault(provider, {})[fld] = env[var].strip()
    names = registry.provider_names()
    for var, value in env.items():
        if not var.startswith("EXECBOX_") or not value.strip():
            continue
        rest = var[len("EXECBOX_"):].lower()
        for provider in names:
            if rest.startswith(provider + "_"):
                fld = rest[len(provider) + 1:]
                if fld in (schema_or_none(provider) or {}):
                    configs.setdefault(provider, {})[fld] = value.strip()


__all__ = ["ACTIVE", "ENV_FIELDS", "FALLBACK", "PREFIX", "SEED_ENV", "default_seed_file", "first_boot_rows",
           "provider_schema", "read_seed", "schema_or_none", "setting_name"]
