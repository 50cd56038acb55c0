"""Is the execbox token that created an E2B sandbox still valid?

The sandbox URL authenticates with the sandbox's own access token, which outlives nothing by
itself: without this check a revoked API key's sandbox would keep running code until its
timeout (up to 24 h). The answer is cached per token for ``ttl`` seconds so a busy sandbox
costs the store one lookup per token every few seconds, not one per request; a revocation
therefore takes effect within ``ttl`` seconds on the sandbox URL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

CREATOR_CHECK_TTL = 5.0
"""Seconds a token's validity is trusted before the store is asked again."""


class TokenLiveness:
    """Cached ``lookup(token_id) -> valid``; a failed lookup raises and is not cached."""

    def __init__(self, lookup: Callable[[str], bool], ttl: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._lookup = lookup
        self._ttl = CREATOR_CHECK_TTL if ttl is None else ttl
        self._clock = clock
        self._seen: dict[str, tuple[float, bool]] = {}
        self._lock = threading.Lock()

    def cached(self, token_id: str) -> bool | None:
        """The answer from the last ``ttl`` seconds, or None when the store must be asked."""
        with self._lock:
            hit = self._seen.get(token_id)
        if hit is None or self._clock() - hit[0] >= self._ttl:
            return None
        return hit[1]

    def check(self, token_id: str) -> bool:
        """Whether the token is valid: the cached answer, else the store's (blocking)."""
        hit = self.cached(token_id)
        if hit is not None:
            return hit
        valid = bool(self._lookup(token_id))
        with self._lock:
            self._seen[token_id] = (self._clock(), valid)
            if len(self._seen) > 4096:  # tokens come and go: drop the stale answers
                now = self._clock()
                self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self._ttl}
        return valid


def store_lookup(store: Any) -> Callable[[str], bool]:
    """A token is valid while its row exists and is not revoked (tokens have no expiry)."""
    def valid(token_id: str) -> bool:
        record = store.tokens.get(token_id)
        return record is not None and record.revoked_at is None

    return valid
