"""A provider configuration's secret fields (``secret: true`` in its schema): how people see them,
when a stored one may be kept, and which values are accepted at all.

- Shown as ``crypto.redact`` gives them (``****`` + at most the last 4), a structured one as ``****``.
- Sent back redacted (or left out), the stored secret is kept, unless a ``secret_destination``
  field (endpoint, API URL, domain) changed with it: a stored secret never goes somewhere new.
- A secret is sent as an HTTP header value (``Authorization: Bearer``, E2B's ``X-API-Key``, an
  Aliyun signature) by HTTP clients that encode headers as ASCII: one with a CR, LF, NUL or any
  character outside printable ASCII cannot be used at all (review 47, F5: a trailing newline was
  stored, and every use then failed). It is refused when configured, naming the field; the value
  itself is never echoed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..crypto import REDACTED_PREFIX, is_encrypted, is_redacted, redact

STRUCTURED_SECRETS = frozenset({"network_credentials"})
"""Secret fields holding a JSON document ({host: {header: value}}): the last 4 characters of the
text would be a fragment of some value (of any length) and JSON punctuation, so they show as
``****`` only. Their header values are checked where the document is parsed (egress policy)."""


def shown_secret(field: str, value: str) -> str:
    """A stored secret as people see it (and send back to keep it): ``crypto.redact``, or just
    ``****`` for a structured one."""
    if field in STRUCTURED_SECRETS:
        return REDACTED_PREFIX if value else ""
    return redact(value)


def secret_value_problem(field: str, value: Any) -> str | None:
    """Why ``value`` cannot be used as the secret ``field`` (printable ASCII only), or None. The
    message names the offending character by kind and position, never the value."""
    if field in STRUCTURED_SECRETS or not isinstance(value, str):
        return None
    for i, ch in enumerate(value):
        if " " <= ch <= "~":
            continue
        kind = {"\r": "a carriage return (CR)", "\n": "a line feed (LF)", "\x00": "a NUL byte",
                "\t": "a tab"}.get(ch) or ("a control character" if ord(ch) < 0x20 or 0x7f <= ord(ch) < 0xa0
                                           else "a non-ASCII character")
        return (f"contains {kind} at position {i + 1}: a secret is sent as an HTTP header value and "
                "must be printable ASCII (check for a trailing newline)")
    return None


def _destination_value(spec: Mapping[str, Any], value: Any) -> Any:
    return spec.get("default", "") if value in (None, "") else value


def moved_destinations(schema: Mapping[str, Mapping[str, Any]], config: Mapping[str, Any],
                       stored: Mapping[str, Any]) -> list[str]:
    """The ``secret_destination`` fields (providers/base.py) whose value in ``config`` differs from
    the stored one (an unset field counts as its schema default): where a stored secret must not
    follow without being sent again."""
    return [k for k, spec in schema.items() if spec.get("secret_destination")
            and _destination_value(spec, config.get(k)) != _destination_value(spec, stored.get(k))]


def resolve_secrets(schema: Mapping[str, Mapping[str, Any]], config: dict[str, Any],
                    load_stored: Callable[[], dict[str, Any]]) -> dict[str, str]:
    """Put the stored secret in ``config`` for every secret field left out or sent back redacted
    (unless a destination moved); returns ``{field: problem}`` for the secrets that cannot be
    taken: a ciphertext, a placeholder matching nothing stored, a moved destination, or a value
    that is no usable header value. ``load_stored``: the provider's decrypted row (read once)."""
    errors: dict[str, str] = {}
    current: dict[str, Any] | None = None
    for key, spec in schema.items():
        if not spec.get("secret"):
            continue
        value = config.get(key)
        if is_encrypted(value):
            errors[key] = "looks like a stored ciphertext; send the secret itself"
            continue
        if value is not None and not is_redacted(value):
            problem = secret_value_problem(key, value)
            if problem:
                errors[key] = problem
            continue
        if current is None:
            current = load_stored()
        stored = current.get(key)
        if not stored or (value is not None and shown_secret(key, stored) != value):
            if value is not None:
                errors[key] = "is a redacted placeholder that matches no stored secret; send the full value"
            continue
        moved = moved_destinations(schema, config, current)
        if moved:
            # the stored secret would go to where the new value points (an admin's listener):
            # only a secret sent with the change may go there
            errors[key] = f"re-enter {key} when {' and '.join(moved)} change{'s' if len(moved) == 1 else ''}"
            continue
        config[key] = stored  # omitted, or its redacted value sent back unchanged: keep it
    return errors


def stored_secret_problems(schema: Mapping[str, Mapping[str, Any]], values: Mapping[str, Any]) -> dict[str, str]:
    """``{field: problem}`` for stored (decrypted) secrets that could not be used (saved before
    they were checked): what activating the provider must refuse."""
    return {k: p for k, spec in schema.items() if spec.get("secret")
            and (p := secret_value_problem(k, values.get(k)))}


__all__ = ["STRUCTURED_SECRETS", "moved_destinations", "resolve_secrets", "secret_value_problem", "shown_secret",
           "stored_secret_problems"]
