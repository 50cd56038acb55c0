"""The provider rows' names, and what the first boot writes into them: the seed file's rows
(RAGFlow's ``conf/system_settings.json``) with the environment's overrides applied.

``SandboxSettings.seed`` (sandbox_settings.py) checks each provider's configuration as the admin
API would (:func:`checked_first_boot`: SB002 naming the variable, nothing written), encrypts the
secrets among them and writes them, once per store. SANDBOX_TIMEOUT_SEC above a provider's maximum
is lowered to it (:func:`clamp_global_timeout`); later boots warn about the first-boot variables
still set (:func:`warn_ignored_on_later_boot`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
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
TIMEOUT_ENV = "SANDBOX_TIMEOUT_SEC"

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


Sources = dict[str, dict[str, str]]
"""``{provider: {field: where its value came from}}``: the environment variable, or the seed row."""


def first_boot_rows(seed_file: Path | None, env: Mapping[str, str]) -> tuple[
        dict[str, str], dict[str, str], dict[str, dict[str, Any]], Sources]:
    """``(values, data_types, configs, sources)``: the active and fallback rows, each provider's
    configuration (only its schema's fields; secrets still in clear; not yet validated: see
    :func:`checked_first_boot`) from the seed file (default: :func:`default_seed_file`) with
    ``env`` applied, and where each value came from."""
    rows = read_seed(seed_file if seed_file is not None else default_seed_file())
    configs: dict[str, dict[str, Any]] = {}
    sources: Sources = {}
    for name, (_dt, value) in rows.items():
        if name.startswith(PREFIX) and name not in (ACTIVE, FALLBACK):
            try:
                parsed = json.loads(value or "{}")
            except json.JSONDecodeError:
                raise InvalidConfigError(f"seed row {name} is not JSON", details={"field": name}) from None
            configs[name[len(PREFIX):]] = {k: v for k, v in parsed.items() if v not in ("", None)}
            sources[name[len(PREFIX):]] = {k: f"seed row {name}" for k in configs[name[len(PREFIX):]]}
    apply_env(configs, env, sources)
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
    clamp_global_timeout(configs, sources, env)
    return values, types, configs, sources


def apply_env(configs: dict[str, dict[str, Any]], env: Mapping[str, str], sources: Sources | None = None) -> None:
    """SANDBOX_TIMEOUT_SEC, :data:`ENV_FIELDS` and EXECBOX_<PROVIDER>_<FIELD> into ``configs``,
    each variable's name into ``sources``."""
    sources = {} if sources is None else sources

    def put(provider: str, fld: str, value: Any, var: str) -> None:
        configs.setdefault(provider, {})[fld] = value
        sources.setdefault(provider, {})[fld] = var

    timeout = env.get(TIMEOUT_ENV, "").strip()
    if timeout:
        seconds = max(1, round(parse_duration(timeout, TIMEOUT_ENV)))
        for provider in registry.provider_names():
            schema = schema_or_none(provider) or {}
            if "timeout" in schema:
                put(provider, "timeout", seconds, TIMEOUT_ENV)
    for var, (provider, fld) in ENV_FIELDS.items():
        if env.get(var, "").strip():
            put(provider, fld, env[var].strip(), var)
    names = registry.provider_names()
    for var, value in env.items():
        if not var.startswith("EXECBOX_") or not value.strip():
            continue
        rest = var[len("EXECBOX_"):].lower()
        for provider in names:
            if rest.startswith(provider + "_"):
                fld = rest[len(provider) + 1:]
                if fld in (schema_or_none(provider) or {}):
                    put(provider, fld, value.strip(), var)


def _whole(value: Any) -> int | None:
    try:
        return int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        return None


def clamp_global_timeout(configs: dict[str, dict[str, Any]], sources: Sources, env: Mapping[str, str]) -> None:
    """SANDBOX_TIMEOUT_SEC is one value for every provider: where it is above a provider's maximum
    (the schema's, or the seeded ``max_timeout``; aliyun allows 30 s) that provider gets its
    maximum, with a warning, so a global setting never leaves a provider nobody uses unusable."""
    lowered: list[str] = []
    seconds = 0
    for provider, cfg in configs.items():
        if sources.get(provider, {}).get("timeout") != TIMEOUT_ENV:
            continue  # a provider's own EXECBOX_<PROVIDER>_TIMEOUT (or none): checked as given
        schema = schema_or_none(provider) or {}
        limits = [schema.get("timeout", {}).get("max"),
                  _whole(cfg.get("max_timeout", schema.get("max_timeout", {}).get("default")))]
        limit = min((n for n in limits if isinstance(n, int) and n >= 1), default=None)
        if limit is not None and cfg["timeout"] > limit:
            lowered.append(f"{provider} ({limit}s)")
            seconds, cfg["timeout"] = cfg["timeout"], limit
    if lowered:
        log.warning("%s=%s (%ss) is above the maximum timeout of %s: each is seeded with its maximum",
                    TIMEOUT_ENV, env.get(TIMEOUT_ENV, "").strip(), seconds, ", ".join(lowered))


def checked_first_boot(configs: dict[str, dict[str, Any]], sources: Sources,
                       problems: Callable[[str, dict[str, Any]], tuple[dict[str, Any], dict[str, str]]],
                       ) -> dict[str, dict[str, Any]]:
    """Each provider's seeded configuration as ``problems`` (the admin API's validation) cleans it.
    A field it refuses is SB002 naming the variable (or seed row) that set it; a required field
    nobody set is fine (the provider is configured later). Raises before anything is written."""
    out: dict[str, dict[str, Any]] = {}
    bad: dict[str, str] = {}
    for provider, cfg in configs.items():
        if schema_or_none(provider) is None:  # no such provider installed: kept as it was
            out[provider] = cfg
            continue
        clean, errors = problems(provider, cfg)
        origin = sources.get(provider, {})
        for fld, problem in errors.items():
            if fld not in cfg and problem == "is required":
                continue
            where = origin.get(fld) or ", ".join(sorted(set(origin.values()))) or f"seed row {setting_name(provider)}"
            named = problem.startswith((f"{fld} ", f"{fld}:"))  # validate_config's messages name their field
            line = f"{provider} {problem}" if named else f"{provider} {fld}: {problem}"
            bad[where] = f"{bad[where]}; {line}" if where in bad else line
        out[provider] = clean
    if bad:
        raise InvalidConfigError(
            "first-boot configuration is invalid, nothing was stored: "
            + "; ".join(f"{where}: {line}" for where, line in bad.items()),
            details={"fields": bad})
    return out


def ignored_on_later_boot(env: Mapping[str, str]) -> list[str]:
    """The variables set in ``env`` that only the first boot reads (their values are in the
    store now): not the AGENTRUN_* ones (aliyun still falls back to them for a field left empty),
    nor EXECBOX_E2B_DOMAIN (also the E2B-compatible API's sandbox domain)."""
    from ...env_names import KNOWN
    from ...providers.aliyun_config import ENV_FALLBACKS

    still_read = set(ENV_FALLBACKS.values())
    names = [TIMEOUT_ENV] if env.get(TIMEOUT_ENV, "").strip() else []
    names += [v for v in ENV_FIELDS if env.get(v, "").strip() and v not in still_read]
    fields = {f"EXECBOX_{p}_{f}".upper() for p in registry.provider_names() for f in (schema_or_none(p) or {})}
    names += sorted(v for v in env if v in fields and v not in KNOWN and env[v].strip())
    return names


def warn_ignored_on_later_boot(env: Mapping[str, str], active: str | None) -> None:
    """On a boot after the first: a warning for each first-boot variable set in ``env`` (the
    store is the source of truth now), and for SANDBOX_TYPE naming another provider than the
    active one."""
    wanted = sandbox_type(env)
    if wanted and active and wanted != active:
        log.warning("SANDBOX_TYPE=%s is ignored: the settings store (the source of truth after "
                    "first boot) has %s active; use `execbox config activate %s`", wanted, active, wanted)
    ignored = ignored_on_later_boot(env)
    if ignored:
        log.warning("%s %s ignored: %s only read on first boot, and the settings store (the source of "
                    "truth after it) is seeded already; change settings with `execbox config set`, the "
                    "admin API or the console", ", ".join(ignored), "is" if len(ignored) == 1 else "are",
                    "it is" if len(ignored) == 1 else "they are")


__all__ = ["ACTIVE", "ENV_FIELDS", "FALLBACK", "PREFIX", "SEED_ENV", "TIMEOUT_ENV", "checked_first_boot",
           "clamp_global_timeout", "default_seed_file", "first_boot_rows", "ignored_on_later_boot",
           "provider_schema", "read_seed", "schema_or_none", "setting_name", "warn_ignored_on_later_boot"]
