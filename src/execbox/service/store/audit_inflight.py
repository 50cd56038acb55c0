"""Runs started and not yet audited (table ``audit_inflight``, migration 0005).

The audit row of a run is written when the run ends. A run that the service's own end cut off
(SIGKILL, OOM kill, host crash) never ends here, although its code ran: at its start the audit
writer files what its row will say, the row's arrival removes that again (in one transaction),
and whatever is left at the next start becomes an audit row with status ``interrupted``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy import delete, insert, or_, select
from sqlalchemy.engine import Connection, Engine

from .models import AuditEntry, AuditInflight
from .repos import AUDIT_FIELDS, audit_row

STALE_AFTER = 86400.0
"""Seconds after which any replica's left-over entry is recovered (a replica that never came back)."""


def apply(conn: Connection, begins: Iterable[dict[str, Any]], ends: Iterable[str]) -> None:
    """File started runs (``{"key", "replica", "record"}``) and drop those whose row came."""
    rows = [{"key": b["key"], "replica": b["replica"][:128], "started_at": b["record"]["created_at"],
             "record": json.dumps(b["record"])} for b in begins]
    if rows:
        conn.execute(insert(AuditInflight), rows)
    done = list(ends)
    if done:
        conn.execute(delete(AuditInflight).where(AuditInflight.key.in_(done)))


def recover(engine: Engine, replica: str, stale_after: float = STALE_AFTER) -> int:
    """Turn this replica's left-over entries (and any replica's older than ``stale_after``) into
    audit rows with status ``interrupted``; returns how many."""
    cutoff = time.time() - stale_after
    with engine.begin() as conn:
        left = conn.execute(select(AuditInflight).where(
            or_(AuditInflight.replica == replica[:128], AuditInflight.started_at < cutoff))).all()
        if not left:
            return 0
        rows = []
        for entry in left:
            fields = json.loads(entry.record)
            fields.update(status="interrupted", duration_ms=None, exit_code=None, memory_used_mb=None,
                          error_code=None)
            rows.append(audit_row({k: v for k, v in fields.items() if k in AUDIT_FIELDS}))  # NUL escaped
        conn.execute(insert(AuditEntry), rows)
        conn.execute(delete(AuditInflight).where(AuditInflight.key.in_([e.key for e in left])))
    return len(rows)
