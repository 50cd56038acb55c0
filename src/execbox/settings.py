"""Environment parsing: SANDBOX_TYPE / SANDBOX_BACKEND, SANDBOX_TIMEOUT_SEC and friends.

Every value is parsed strictly: a value that cannot be understood is an SB002 error naming the
variable, never a silent default (RAGFlow's executor turned "60" into 10 s).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from .errors import InvalidConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: str | int | float, name: str = "timeout") -> float:
    """'60', '60s', '1m', '1.5h', '500ms', 60 -> seconds (> 0). Anything else: SB002."""
    if isinstance(value, bool):
        raise InvalidConfigError(f"{name}: {value!r} is not a duration", details={"field": name})
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise InvalidConfigError(
                f"{name}: {value!r} is not a duration; use seconds ('60'), or a unit: '60s', '1m', '500ms', '1h'",
                details={"field": name, "value": str(value)},
            )
        unit = m.group(2).lower() if m.group(2) else None
        seconds = float(m.group(1)) * _UNIT_SECONDS[unit]
    if seconds <= 0:
        raise InvalidConfigError(f"{name}: must be greater than zero (got {value!r})",
                                 details={"field": name, "value": str(value)})
    return seconds


def parse_bool(value: str, name: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise InvalidConfigError(f"{name}: {value!r} is not a boolean (use true/false)", details={"field": name})


def parse_int(value: str, name: str, minimum: int = 0) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise InvalidConfigError(f"{name}: {value!r} is not an integer", details={"field": name}) from None
    if n < minimum:
        raise InvalidConfigError(f"{name}: must be >= {minimum}", details={"field": name})
    return n


def env_int(name: str, default: int, minimum: int = 0, env: Mapping[str, str] | None = None) -> int:
    """The integer environment variable ``name``, or ``default`` when it is unset or blank; a value
    that is not a whole number >= ``minimum`` is SB002 naming the variable, never the default."""
    raw = (os.environ if env is None else env).get(name, "").strip()
    return parse_int(raw, name, minimum) if raw else default


def env_duration(name: str, default: float, env: Mapping[str, str] | None = None) -> float:
    """The duration environment variable ``name`` ('60', '1m', '500ms'), or ``default`` when it is
    unset or blank; a bad value is SB002 naming the variable."""
    raw = (os.environ if env is None else env).get(name, "").strip()
    return parse_duration(raw, name) if raw else default


def parse_days(value: str, name: str) -> float:
    """A retention in days: a number >= 0 (``0``: keep everything; ``1.5`` allowed). Anything else: SB002."""
    try:
        days = float(value.strip())
    except ValueError:
        raise InvalidConfigError(f"{name}: {value!r} is not a number of days (use e.g. 30, or 0 to keep "
                                 "everything)", details={"field": name, "value": value}) from None
    if not days >= 0 or days == float("inf"):  # NaN fails >= too
        raise InvalidConfigError(f"{name}: must be a number of days >= 0 (got {value!r}; 0 keeps everything)",
                                 details={"field": name, "value": value})
    return days


def sandbox_type(env: Mapping[str, str] | None = None) -> str | None:
    """SANDBOX_TYPE, else its alias SANDBOX_BACKEND; None when unset (zero-config)."""
    env = os.environ if env is None else env
    for key in ("SANDBOX_TYPE", "SANDBOX_BACKEND"):
        value = env.get(key, "").strip()
        if value:
            return value.lower()
    return None


def sandbox_timeout(env: Mapping[str, str] | None = None, default: float = 30.0) -> float:
    env = os.environ if env is None else env
    raw = env.get("SANDBOX_TIMEOUT_SEC")
    if raw is None or raw.strip() == "":
        return default
    return parse_duration(raw, "SANDBOX_TIMEOUT_SEC")
