"""Error helpers shared by the cloud providers (E2B, AgentRun): what their SDKs raise, seen from here.

Running code in those clouds is providers/remote_agent.py (the agent itself, uploaded); this
module only classifies SDK failures and keeps credentials out of error messages.
"""

from __future__ import annotations

from ..redaction import scrub

_CONNECT_MARKERS = ("connection refused", "failed to establish a new connection", "name or service not known",
                    "tcp connect error", "temporary failure in name resolution", "network is unreachable",
                    "no route to host")


def is_connect_error(err: BaseException) -> bool:
    """The SDK could not reach the cloud at all (SB003), whatever exception type it wraps that in."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ConnectionError) or type(e).__name__ in ("ConnectError", "ConnectTimeout"):
            return True
        if any(m in str(e).lower() for m in _CONNECT_MARKERS):
            return True
        e = e.__cause__ or e.__context__
    return False


def mask_secrets(text: str, secrets_: list[str | None]) -> str:
    """``text`` with each secret (any length) shown as its redacted form: ``****`` plus the last 4
    characters of a secret of 12 or more, nothing of a shorter one (redaction.scrub)."""
    return scrub(text, [s for s in secrets_ if s])
