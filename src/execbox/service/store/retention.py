"""How long an append-only audit table keeps its rows, and the pruning its writer does now and then.

Both audit trails grow with every operation: the run audit (``audit``, ``EXECBOX_AUDIT_DAYS``,
default 365) and the egress audit (``egress_audit``, ``EXECBOX_EGRESS_AUDIT_DAYS``, default 30).
``0`` keeps every row. Each writer prunes from its own thread, at its first batch (a service that
restarts often still prunes) and then at most once an hour, in batches of ``PRUNE_BATCH`` rows,
each its own transaction: a table with millions of old rows (the first prune after an upgrade)
never holds the database's write lock for long.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from ...errors import InvalidConfigError
from ...settings import parse_days

PRUNE_EVERY = 3600.0  # seconds between prunes of one table
PRUNE_BATCH = 5000  # rows per delete: each its own short transaction, so other writers go between


def retention_days(env: str, default: float) -> float:
    """Days of rows the table named by ``env`` keeps (``0``: all of them). ``execbox serve`` refuses
    a bad value at start (ServiceSettings.from_env: SB002 naming the variable); a program that
    embeds the store without that check gets the default and a warning, never a silent change."""
    raw = os.environ.get(env, "")
    if not raw.strip():
        return default
    try:
        return parse_days(raw, env)
    except InvalidConfigError as e:
        logging.getLogger("execbox.service.store").warning("%s; keeping the default of %g days", e.message, default)
        return default


class Pruner:
    """Deletes a table's rows older than its retention, at most once per ``PRUNE_EVERY``."""

    def __init__(self, env: str, default: float, prune: Callable[[float], int], log: logging.Logger,
                 what: str) -> None:
        self.env, self.default, self.prune, self.log, self.what = env, default, prune, log, what
        self._at = 0.0

    def now_and_then(self) -> None:
        days = retention_days(self.env, self.default)
        if not days or (self._at and time.monotonic() - self._at < PRUNE_EVERY):
            return
        self._at = time.monotonic()
        try:
            n = self.prune(time.time() - days * 86400)
            if n:
                self.log.info("%s: %d rows older than %g days removed", self.what, n, days)
        except Exception:  # noqa: BLE001 - retention must not stop the writer
            self.log.exception("%s: pruning failed", self.what)


def delete_older(sessions: sessionmaker[Session], model: Any, column: Any, older_than: float) -> int:
    """Delete ``model``'s rows whose ``column`` is before ``older_than``, oldest first, in batches;
    how many."""
    total = 0
    while True:
        batch = select(model.id).where(column < older_than).order_by(model.id).limit(PRUNE_BATCH)
        with sessions.begin() as s:
            n = s.execute(delete(model).where(model.id.in_(batch.scalar_subquery()))).rowcount or 0
        total += n
        if n < PRUNE_BATCH:
            return total
