"""Validate provider config against its self-describing schema: type, required, min, max, options.

Used by ``initialize`` (library), the admin API and the CLI, so all three reject the same input
with the same per-field messages.
"""

from __future__ import annotations

import math
import re
from typing import Any
from urllib.parse import urlsplit

from ..errors import InvalidConfigError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(value: Any) -> int:
    """'512m', '1g', '256MiB', 1048576 -> bytes. Raises ValueError on anything else."""
    if isinstance(value, bool):
        raise ValueError("not a size")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError("size must be positive")
        return int(value)
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a size like 512m or 1g")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError("size must be positive")
    return n


def url_problem(field: str, value: Any, *, secret_field: str | None = None) -> str | None:
    """Why ``value`` is not a usable http(s) URL for config field ``field``, or None.

    The shared check of every provider URL field (self_managed ``endpoint``, e2b ``api_url`` and
    ``sandbox_url``, aliyun ``control_endpoint`` and ``data_endpoint``): http or https, a host, no
    query or fragment and above all no ``user:password@`` credentials. URL fields are shown whole
    in the config, errors and logs, so a password must go in a secret field (``secret_field``,
    named in the message) instead. The message never echoes the value.
    """
    raw = str(value)
    instead = f"; set {secret_field} instead" if secret_field else ""
    try:
        parts = urlsplit(raw)
        hostname = parts.hostname
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return f"{field} must be an http:// or https:// URL"
    if "@" in parts.netloc or (not parts.netloc and "@" in raw):
        return f"{field} must not carry credentials (user:password@host){instead}"
    if parts.scheme not in ("http", "https") or not hostname:
        return f"{field} must be an http:// or https:// URL with a host"
    if parts.query or parts.fragment:
        return f"{field} must not carry a query or fragment"
    return None


def _coerce(field: str, spec: dict[str, Any], value: Any) -> Any:
    kind = spec.get("type", "string")
    if kind == "integer":
        if isinstance(value, bool):
            raise ValueError("must be an integer")
        if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
            value = int(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise ValueError("must be an integer")
    elif kind == "number":
        if isinstance(value, bool):
            raise ValueError("must be a number")
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ValueError("must be a number") from None
        if not isinstance(value, (int, float)):
            raise ValueError("must be a number")
        if not math.isfinite(value):  # NaN passes every min/max comparison; not valid JSON either
            raise ValueError("must be a finite number")
    elif kind == "boolean":
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            value = value.lower() in ("true", "1", "yes", "on")
        if not isinstance(value, bool):
            raise ValueError("must be true or false")
    elif kind == "list":
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError("must be a list of strings")
    elif kind == "json":
        pass
    else:
        if not isinstance(value, str):
            raise ValueError("must be a string")
    if spec.get("options") is not None:
        allowed = [o["value"] if isinstance(o, dict) else o for o in spec["options"]]
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(map(str, allowed))}")
    if kind in ("integer", "number"):
        if spec.get("min") is not None and value < spec["min"]:
            raise ValueError(f"must be >= {spec['min']}")
        if spec.get("max") is not None and value > spec["max"]:
            raise ValueError(f"must be <= {spec['max']}")
    if spec.get("format") == "size" and value not in ("", None):
        parse_size(value)
    return value


def validate_against_schema(schema: dict[str, dict[str, Any]], config: dict[str, Any],
                            *, fill_defaults: bool = True) -> tuple[dict[str, Any], dict[str, str]]:
    """Return (clean config, {field: error}). Unknown fields are errors: typos must not pass."""
    if not isinstance(config, dict):
        return {}, {"config": "must be a JSON object"}
    clean: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for key in config:
        if key not in schema:
            errors[key] = f"unknown field (known: {', '.join(sorted(schema))})"
    for key, spec in schema.items():
        value = config.get(key)
        if value is None or (value == "" and spec.get("type", "string") != "string"):
            if spec.get("required") and spec.get("default") is None:
                errors[key] = "is required"
            elif fill_defaults and "default" in spec:
                clean[key] = spec["default"]
            continue
        if value == "" and spec.get("required"):
            errors[key] = "is required"
            continue
        try:
            clean[key] = _coerce(key, spec, value)
        except ValueError as e:
            errors[key] = str(e)
    return clean, errors


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def cross_field_errors(config: dict[str, Any]) -> dict[str, str]:
    """``{field: error}`` for the rules that span fields (the schema checks one field at a time),
    on a configuration with defaults applied. A default ``timeout`` above ``max_timeout`` would
    make every run that names no timeout fail (SB002 "exceeds this provider's maximum"), so it is
    refused when configured, naming ``timeout``."""
    timeout, limit = config.get("timeout"), config.get("max_timeout")
    if _number(timeout) and _number(limit) and timeout > limit:
        return {"timeout": f"must be <= max_timeout ({limit})"}
    return {}


def check_config(schema: dict[str, dict[str, Any]], config: dict[str, Any], provider: str) -> dict[str, Any]:
    """validate_against_schema, raising SB002 with per-field details."""
    clean, errors = validate_against_schema(schema, config)
    if errors:
        summary = "; ".join(f"{k}: {v}" for k, v in errors.items())
        raise InvalidConfigError(f"invalid {provider} configuration: {summary}",
                                 details={"provider": provider, "fields": errors})
    return clean
