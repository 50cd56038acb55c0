"""Which paths take a token, and how (service/token_gate.py checks it before the body is read).

Kept apart from the gate so ForwardToOwner can ask too: it buffers a body only on these paths,
whose token the gate has checked by then; any other path (unknown ones included) is passed on
unbuffered, so no request without a token makes the service hold its body (review 47, F3).
"""

from __future__ import annotations

BEARER_PREFIXES = ("/api/admin/", "/v1/sandbox/", "/sessions/")
BEARER_PATHS = frozenset({"/api/admin", "/v1/sandbox", "/sessions", "/execute", "/bash", "/read", "/read_binary",
                          "/write", "/grep", "/glob", "/list", "/whoami", "/delete", "/mkdir", "/move"})
"""The gateway API's direct (unprefixed) paths and the admin API: execbox bearer tokens."""
E2B_PATHS = ("/sandboxes", "/v2/sandboxes")
E2B_UNAUTHORIZED = "invalid or missing API key (use an execbox token as E2B_API_KEY)"
"""As e2b_compat.control.principal answers it."""


def scheme_for(path: str) -> str | None:
    """``"bearer"``, ``"run"`` (RAGFlow's /run), ``"e2b"`` (X-API-Key or bearer), or None: no
    token is checked before the route (health, metrics, /mcp, the console, unknown paths)."""
    if path in BEARER_PATHS or path.startswith(BEARER_PREFIXES):
        return "bearer"
    if path == "/run":
        return "run"
    if any(path == p or path.startswith(p + "/") for p in E2B_PATHS):
        return "e2b"
    return None


__all__ = ["E2B_UNAUTHORIZED", "scheme_for"]
