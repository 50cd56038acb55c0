"""Egress audit table and tenant network caps (issue 14).

Kept out of models.py/repos.py so it merges cleanly: the table is declared on the same ``Base``
(migration 0004 creates it), the caps are one JSON row in ``system_settings``.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from typing import Any

from sqlalchemy import BigInteger, Boolean, Float, Integer, String, insert, select
from sqlalchemy.orm import Mapped, mapped_column

from ...egress.audit import AuditRecord
from ...egress.policy import EgressPolicy, parse_policy
from ...errors import InvalidConfigError
from ..logs import db_error
from .models import Base
from .retention import Pruner, delete_older
from .safe_text import storable_fields

log = logging.getLogger("execbox.egress")
CAPS_SETTING = "egress.tenant_caps"
RETENTION_ENV = "EXECBOX_EGRESS_AUDIT_DAYS"
DEFAULT_RETENTION_DAYS = 30.0


class EgressAuditEntry(Base):
    __tablename__ = "egress_audit"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    ts: Mapped[float] = mapped_column(Float(precision=53), nullable=False, index=True)
    tenant_id: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)
    session_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    run_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    box: Mapped[str] = mapped_column(String(128), nullable=False)
    kind: Mapped[str] = mapped_column(String(8), nullable=False)
    host: Mapped[str | None] = mapped_column(String(253), nullable=True)
    ip: Mapped[str | None] = mapped_column(String(45), nullable=True)
    port: Mapped[int | None] = mapped_column(Integer, nullable=True)
    decision: Mapped[str] = mapped_column(String(16), nullable=False, index=True)
    reason: Mapped[str | None] = mapped_column(String(300), nullable=True)
    bytes_up: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    bytes_down: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    duration_ms: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    injected: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)


FIELDS = ("ts", "tenant_id", "session_id", "run_id", "box", "kind", "host", "ip", "port", "decision", "reason",
          "bytes_up", "bytes_down", "duration_ms", "injected")


class PartlyWritten(Exception):
    """Some rows of a batch could not be written even one by one (the others were)."""

    def __init__(self, failed: int, total: int) -> None:
        super().__init__(f"{failed} of {total} egress audit records could not be written")
        self.failed = failed


class EgressAuditRepo:
    def __init__(self, sessions: Any) -> None:
        self._sessions = sessions

    def insert_many(self, records: list[AuditRecord]) -> None:
        """One transaction for the batch; should it fail, each row on its own, so one bad row
        cannot cost the other attempts' records. Host names come from the boxes' own DNS queries
        (any bytes): NUL and lone surrogates are stored escaped (safe_text), as PostgreSQL
        refuses NUL in text."""
        rows = []
        for r in records:
            d = r.to_dict()
            row = storable_fields({k: d.get(k) for k in FIELDS})
            for k in ("reason", "host", "box", "tenant_id", "session_id", "run_id"):
                length = EgressAuditEntry.__table__.c[k].type.length
                if isinstance(row[k], str) and len(row[k]) > length:
                    row[k] = row[k][:length]
            rows.append(row)
        if not rows:
            return
        try:
            with self._sessions.begin() as s:
                s.execute(insert(EgressAuditEntry), rows)
            return
        except Exception as e:  # noqa: BLE001 - retried row by row below
            if len(rows) == 1:
                raise
            log.error("egress audit: writing %d records failed (%s); retrying one by one", len(rows), db_error(e))
        failed = 0
        for row in rows:
            try:
                with self._sessions.begin() as s:
                    s.execute(insert(EgressAuditEntry), [row])
            except Exception:  # noqa: BLE001
                failed += 1
        if failed:
            raise PartlyWritten(failed, len(rows))

    def prune(self, older_than: float) -> int:
        """Delete rows written before ``older_than`` (epoch seconds); returns how many."""
        return delete_older(self._sessions, EgressAuditEntry, EgressAuditEntry.ts, older_than)

    def list(self, *, limit: int = 100, tenant_id: str | None = None, session_id: str | None = None,
             decision: str | None = None) -> list[dict[str, Any]]:
        q = select(EgressAuditEntry).order_by(EgressAuditEntry.id.desc()).limit(max(1, min(limit, 1000)))
        if tenant_id:
            q = q.where(EgressAuditEntry.tenant_id == tenant_id)
        if session_id:
            q = q.where(EgressAuditEntry.session_id == session_id)
        if decision:
            q = q.where(EgressAuditEntry.decision == decision)
        with self._sessions() as s:
            return [{"id": r.id, **{f: getattr(r, f) for f in FIELDS}} for r in s.scalars(q)]


class EgressAuditWriter:
    """An egress audit sink: records queue here and one thread writes them in batches."""

    def __init__(self, repo: EgressAuditRepo) -> None:
        self.repo = repo
        self._q: queue.Queue[AuditRecord | threading.Event | None] = queue.Queue(maxsize=20000)
        self.dropped = 0
        self._pruner = Pruner(RETENTION_ENV, DEFAULT_RETENTION_DAYS, repo.prune, log, "egress audit")
        self._thread = threading.Thread(target=self._run, name="execbox-egress-audit", daemon=True)
        self._thread.start()

    def __call__(self, rec: AuditRecord) -> None:
        try:
            self._q.put_nowait(rec)
        except queue.Full:
            self.dropped += 1

    def flush(self, timeout: float = 10.0) -> None:
        """Wait (at most ``timeout``) until what was queued before is written: a full queue over a
        slow store must not hold the caller (an admin API request) for ever."""
        ev = threading.Event()
        deadline = time.monotonic() + timeout
        try:
            self._q.put(ev, timeout=timeout)
        except queue.Full:
            return
        ev.wait(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(10)

    def _run(self) -> None:
        while True:
            item = self._q.get()
            batch: list[AuditRecord] = []
            marks: list[threading.Event] = []
            stop = False
            while True:
                if item is None:
                    stop = True
                elif isinstance(item, threading.Event):
                    marks.append(item)
                else:
                    batch.append(item)
                if stop or len(batch) >= 500:
                    break
                try:
                    item = self._q.get_nowait()
                except queue.Empty:
                    break
            try:
                self.repo.insert_many(batch)
            except PartlyWritten as e:
                self.dropped += e.failed
                log.error("egress audit: %s", e)
            except Exception:  # noqa: BLE001 - the data path never waits on the store
                self.dropped += len(batch)  # lost for good; execbox_egress_audit_dropped_total says so
                log.exception("egress audit: %d records not written", len(batch))
            self._pruner.now_and_then()
            for m in marks:
                m.set()
            if stop:
                return


class TenantCaps:
    """Per-tenant network caps (``{tenant: {network, allow}}`` in one settings row); None = no cap."""

    def __init__(self, settings_repo: Any) -> None:
        self._repo = settings_repo

    def all(self) -> dict[str, dict[str, Any]]:
        raw = self._repo.get(CAPS_SETTING)
        return json.loads(raw) if raw else {}

    def get(self, tenant_id: str) -> EgressPolicy | None:
        cap = self.all().get(tenant_id)
        return parse_policy(cap.get("network"), cap.get("allow")) if cap else None

    def set(self, tenant_id: str, network: Any, allow: Any) -> dict[str, Any]:
        policy = parse_policy(network, allow)  # SB002 naming a bad entry; nothing stored then
        if any(e.headers for e in policy.allow):
            raise InvalidConfigError("tenant caps carry no credentials", details={"field": "allow"})
        value = policy.to_dict()

        def update(old: str | None) -> str:
            caps = json.loads(old) if old else {}
            caps[tenant_id] = value
            return json.dumps(caps, sort_keys=True)

        self._repo.update(CAPS_SETTING, update)
        return value

    def delete(self, tenant_id: str) -> bool:
        found = False

        def update(old: str | None) -> str:
            nonlocal found
            caps = json.loads(old) if old else {}
            found = caps.pop(tenant_id, None) is not None
            return json.dumps(caps, sort_keys=True)

        self._repo.update(CAPS_SETTING, update)
        return found
