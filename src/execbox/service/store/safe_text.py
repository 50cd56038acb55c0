"""Text a tenant controls, made storable on every database the store supports.

PostgreSQL's ``text`` cannot hold a NUL character (psycopg refuses the whole statement with
``DataError``), and no database takes a lone surrogate (it has no UTF-8 form). Either in one
field of an audit row would cost the whole row, or a batch of them: the run happened, its record
must not be lost (review 47, F2). Such characters are stored escaped instead: NUL as the four
characters ``\\x00``, a lone surrogate as ``\\udXXX``. A row's ``code_hash`` is always of the text
as it was submitted, so the stored, escaped code can still be told apart from the original.
"""

from __future__ import annotations

import unicodedata
from typing import Any

NUL_ESCAPE = "\\x00"


def storable(value: str) -> str:
    """``value`` with NUL and lone surrogates escaped; the same object when it has neither."""
    if "\x00" in value:
        value = value.replace("\x00", NUL_ESCAPE)
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def storable_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Every str value of ``fields`` made :func:`storable` (other values as they are)."""
    return {k: storable(v) if isinstance(v, str) else v for k, v in fields.items()}


def control_character(value: str) -> str | None:
    """The first control character (C0, DEL, C1) or lone surrogate in ``value``, as ``U+XXXX``;
    None when there is none. For names people give things (a token's name): refused, not escaped."""
    for ch in value:
        if unicodedata.category(ch) in ("Cc", "Cs"):
            return f"U+{ord(ch):04X}"
    return None


__all__ = ["NUL_ESCAPE", "control_character", "storable", "storable_fields"]
