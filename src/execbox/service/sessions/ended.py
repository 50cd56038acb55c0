"""The sessions this replica ended lately, and how: so that a new session under a name that was
used before can say so (``metadata.session.previous``, the 404 of a request that may not create
one), instead of an agent meeting an empty workspace and wondering where its files went.

In memory, per replica, bounded: a replica that restarted, or another replica's destroy, leaves
nothing here (the registry row of an ended session is gone by design).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

REASONS = {
    "closed": "it was closed (POST .../close, RemoteSandbox.close() or MCP close_session)",
    "deleted": "an admin deleted it (DELETE sessions/{tenant_id}/{session_id} or `execbox session rm`)",
    "idle_timeout": "it was unused for longer than SANDBOX_IDLE_TIMEOUT and the idle reaper removed it",
    "retention_expired": "it was paused (or lost) for longer than EXECBOX_PAUSED_RETENTION",
    "destroyed": "it was destroyed (an E2B sandbox killed or timed out, or an MCP session ended)",
}
"""How a session ended, in words (the keys are ``previous.ended``)."""


class EndedSessions:
    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._rows: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, tenant_id: str, session_id: str, how: str) -> None:
        key = (tenant_id, session_id)
        with self._lock:
            self._rows[key] = {"ended": how, "ended_at": time.time(), "why": REASONS.get(how, REASONS["destroyed"])}
            self._rows.move_to_end(key)
            while len(self._rows) > self.limit:
                self._rows.popitem(last=False)

    def get(self, tenant_id: str, session_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._rows.get((tenant_id, session_id))
            return dict(row) if row else None

    def pop(self, tenant_id: str, session_id: str) -> dict[str, Any] | None:
        with self._lock:
            return self._rows.pop((tenant_id, session_id), None)
