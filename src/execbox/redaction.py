"""How secrets look from outside the process: ``redact`` one value, ``scrub`` every secret out of a
message (or a details dict), ``strip_userinfo`` / ``redact_url_credentials`` for URLs.

The contract: a secret never appears in logs, errors or API responses; at most ``****`` and its
last 4 characters, and nothing at all of a secret under 12 characters. Kept free of imports from
the rest of the package so that providers (below the service layer) and the service's crypto
module (which re-exports ``redact``) share one rule.

Short secrets: a secret of ``WHOLE_MIN`` (8) characters or more is replaced wherever it occurs,
also inside a longer word. A shorter one is replaced only where it stands as a whole token (no
letter, digit or ``_`` right before or after it): ``'k9Z2x'`` and ``Bearer abc`` are scrubbed,
but a 1-3 character secret does not turn every ``a`` or ``abc`` inside other words of a message
into ``****`` (which would wreck the message and, by the pattern of what was replaced, tell the
secret anyway). Secrets that are only whitespace are ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REDACTED_PREFIX = "****"
SHOWN_TAIL_MIN = 12
"""Secrets this long show their last 4 characters; shorter ones show none."""
WHOLE_MIN = 8
"""Secrets this long are scrubbed everywhere; shorter ones only as whole tokens."""


def redact(value: str | None) -> str:
    """What anyone outside the process sees of a secret: the last 4 characters at most."""
    if not value:
        return ""
    tail = value[-4:] if len(value) >= SHOWN_TAIL_MIN else ""
    return REDACTED_PREFIX + tail


def secret_values(value: Any) -> list[str]:
    """Every secret string in ``value``: a string (and, when it is JSON text such as
    ``network_credentials``, each string inside it), or the strings nested in a dict's values or a
    list. A header value ``"Bearer XYZ"`` also yields its credential part ``XYZ``."""
    out: list[str] = []

    def walk(v: Any, depth: int = 0) -> None:
        if depth > 20 or v is None:
            return
        if isinstance(v, str):
            if not v.strip():
                return
            out.append(v)
            words = v.split()
            if len(words) == 2:  # "Bearer XYZ", "Basic XYZ": the credential alone may be quoted
                out.append(words[1])
            text = v.strip()
            if text[:1] in ("{", "["):
                try:
                    walk(json.loads(text), depth + 1)
                except ValueError:
                    pass
        elif isinstance(v, dict):
            for item in v.values():
                walk(item, depth + 1)
        elif isinstance(v, (list, tuple, set)):
            for item in v:
                walk(item, depth + 1)

    walk(value)
    return out


def _pattern(secrets: Iterable[Any]) -> re.Pattern[str] | None:
    values = sorted(set(secret_values(list(secrets))), key=len, reverse=True)  # longest first
    parts = [re.escape(s) if len(s) >= WHOLE_MIN else rf"(?<!\w){re.escape(s)}(?!\w)" for s in values]
    return re.compile("|".join(parts)) if parts else None


def scrub(value: Any, secrets: Iterable[Any]) -> Any:
    """``value`` with every occurrence of each secret replaced by ``redact(secret)``.

    ``value``: a string, or a dict / list / tuple whose strings (keys included) are scrubbed, at any
    depth; anything else is returned as it is. ``secrets``: strings, or dicts / lists / JSON text
    holding them (see ``secret_values``); empty ones are ignored. One pass, longest secret first,
    so a redacted form is never scrubbed again."""
    pattern = _pattern(secrets)
    if pattern is None:
        return value
    return _apply(value, pattern, 0)


def _apply(value: Any, pattern: re.Pattern[str], depth: int) -> Any:
    if isinstance(value, str):
        return pattern.sub(lambda m: redact(m.group(0)), value)
    if depth > 20:
        return value
    if isinstance(value, dict):
        return {_apply(k, pattern, depth + 1): _apply(v, pattern, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_apply(v, pattern, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(_apply(v, pattern, depth + 1) for v in value)
    return value


def strip_userinfo(url: str) -> str:
    """``url`` without its ``user:password@`` part (for display); unparsable text comes back with
    everything up to an ``@`` of its authority hidden."""
    try:
        parts = urlsplit(url)
        if "@" not in parts.netloc:
            return url
        return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    except ValueError:
        return redact_url_credentials(url)


_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s'\"]*@")  # up to the authority's last @


def redact_url_credentials(text: str) -> str:
    """``text`` with the userinfo of every ``scheme://user:password@host`` in it shown as ``****``."""
    return _URL_USERINFO.sub(lambda m: m.group(1) + REDACTED_PREFIX + "@", text)
