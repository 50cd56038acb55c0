"""Structured JSON logs per operation and the audit trail in the store.

One record per execution carries the fields of the RAGFlow design's logging example
(tenant_id, provider, operation, instance_id, language, code_hash, duration_ms, status,
exit_code, memory_used_mb). The same facts go to the store's audit table from a background
writer, so a slow database never adds latency to an execution. The code itself is stored only
with SANDBOX_AUDIT_CODE=true; logs never carry it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

AUDIT_FIELDS = frozenset({"tenant_id", "provider", "operation", "instance_id", "session_id", "token_id",
                          "language", "code_hash", "duration_ms", "status", "exit_code", "memory_used_mb",
                          "error_code", "code", "created_at"})
"""Columns of the store's audit table (execbox.service.store.repos.AUDIT_FIELDS)."""

BEGIN = "_inflight_begin"  # an AuditWriter item filing a started run (store/audit_inflight.py)
END = "_inflight_end"  # in an audit record: the started run whose filing it ends

EXEC_LOG = logging.getLogger("execbox.service.exec")
log = logging.getLogger("execbox.service")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: timestamp, level, logger, message and any ``fields`` extra."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        msg = record.getMessage()
        if msg:
            out["message"] = msg
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_json_logging(level: int = logging.INFO) -> None:
    """Route execbox.* loggers to stderr as JSON lines (``execbox serve`` calls this once)."""
    root = logging.getLogger("execbox")
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


def code_hash(code: str) -> str:
    return "sha256:" + hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()


def memory_mb(metadata: dict[str, Any]) -> float | None:
    kb = metadata.get("peak_memory_kb")
    return round(kb / 1024, 2) if isinstance(kb, (int, float)) else None


def db_error(e: BaseException) -> str:
    """A failed statement, for the log: the exception's type and the driver's first line only.
    Never SQLAlchemy's parameter list (the engines hide it anyway) nor PostgreSQL's DETAIL
    ("Failing row contains (...)"), which would put the submitted code in the log."""
    cause = getattr(e, "orig", None) or e
    first = (str(cause).strip().splitlines() or [""])[0][:200]
    return f"{type(cause).__name__}: {first}" if first else type(cause).__name__


BATCH_LINGER = 0.05  # seconds the writer waits for more records before a transaction
RETENTION_ENV = "EXECBOX_AUDIT_DAYS"  # how long audit rows are kept (store/retention.py)
DEFAULT_RETENTION_DAYS = 365.0
BATCH_MAX = 500


class AuditWriter:
    """Writes audit records to ``store.audit`` on one background thread, in order.

    ``flush()`` waits until everything queued so far is written (tests, shutdown).
    """

    def __init__(self, store: Any) -> None:
        from .store.retention import Pruner

        self._store = store
        # the table would grow by every operation for as long as the service runs
        self._pruner = Pruner(RETENTION_ENV, DEFAULT_RETENTION_DAYS, store.audit.prune, log, "audit")
        self._q: queue.Queue[dict[str, Any] | threading.Event | None] = queue.Queue(maxsize=10000)
        self._thread = threading.Thread(target=self._run, name="execbox-audit", daemon=True)
        self._thread.start()
        self.dropped = 0

    def submit(self, fields: dict[str, Any]) -> None:
        try:
            self._q.put_nowait(fields)
        except queue.Full:
            self.dropped += 1
            log.error("audit queue full; dropped a record", extra={"fields": {"dropped": self.dropped}})

    def _run(self) -> None:
        while True:
            batch: list[dict[str, Any]] = []
            marks: list[threading.Event] = []
            stop = False
            item = self._q.get()
            deadline = time.monotonic() + BATCH_LINGER
            while True:
                if item is None:
                    stop = True
                elif isinstance(item, threading.Event):
                    marks.append(item)
                else:
                    batch.append(item)
                if stop or marks or len(batch) >= BATCH_MAX:
                    break
                try:
                    item = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
            if batch:
                self._write(batch)
                self._pruner.now_and_then()
            for mark in marks:
                mark.set()
            if stop:
                return

    def _write(self, batch: list[dict[str, Any]]) -> None:
        """One transaction per batch: the audit rows and the started runs they end. A run started
        and ended within one batch is never filed as started."""
        rows = [f for f in batch if BEGIN not in f]
        ends = {f.pop(END) for f in rows if f.get(END)}
        begins = [f[BEGIN] for f in batch if BEGIN in f and f[BEGIN]["key"] not in ends]
        ends -= {f[BEGIN]["key"] for f in batch if BEGIN in f}
        try:
            self._insert_many(rows, begins, ends)
            return
        except Exception as e:  # noqa: BLE001 - the audit trail must not take the service down
            log.error("writing %d audit records failed (%s); retrying one by one", len(rows), db_error(e))
        for fields in rows:
            self._write_one(fields)
        try:
            self._insert_many([], begins, ends)
        except Exception as e:  # noqa: BLE001
            log.error("filing %d started runs failed (%s)", len(begins) + len(ends), db_error(e))

    def _write_one(self, fields: dict[str, Any]) -> None:
        """One row on its own; one that still fails is written without its code rather than lost
        (the run happened: tenant, token, code hash and status must stay on record). Logged
        without the statement's values or the database's detail (db_error): no code in the log."""
        try:
            self._store.audit.record(**fields)
            return
        except Exception as e:  # noqa: BLE001
            if fields.get("code") is None:
                log.error("writing an audit record failed (%s); dropped", db_error(e))
                return
            log.error("writing an audit record failed (%s); writing it without its code", db_error(e))
        try:
            self._store.audit.record(**{**fields, "code": None})
        except Exception as e:  # noqa: BLE001
            log.error("writing an audit record without its code failed (%s); dropped", db_error(e))

    def _insert_many(self, batch: list[dict[str, Any]], begins: list[dict[str, Any]], ends: set[str]) -> None:
        from sqlalchemy import insert

        from .store import audit_inflight
        from .store.models import AuditEntry
        from .store.repos import audit_row

        rows = [audit_row({k: v for k, v in fields.items() if k in AUDIT_FIELDS}) for fields in batch]
        with self._store.engine.begin() as conn:
            if rows:
                conn.execute(insert(AuditEntry), rows)
            audit_inflight.apply(conn, begins, ends)

    def flush(self, timeout: float = 10.0) -> bool:
        done = threading.Event()
        self._q.put(done)
        return done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        self.flush(timeout)
        self._q.put(None)
        self._thread.join(timeout)


class OperationLog:
    """Builds the per-execution record, logs it as JSON and hands it to the audit writer."""

    def __init__(self, audit: AuditWriter | None, audit_code: bool, replica: str = "") -> None:
        self.audit = audit
        self.audit_code = audit_code
        self.replica = replica

    def begin(self, *, tenant_id: str, session_id: str | None, provider: str, operation: str,
              instance_id: str | None, language: str, code: str, token_id: str | None = None) -> str | None:
        """File a run that is about to start (its audit row comes with ``execution(inflight=key)``);
        the key, or None without an audit trail."""
        if self.audit is None:
            return None
        key = uuid.uuid4().hex
        record: dict[str, Any] = {
            "tenant_id": tenant_id, "session_id": session_id, "provider": provider, "operation": operation,
            "instance_id": instance_id, "language": language, "code_hash": code_hash(code), "token_id": token_id,
            "created_at": time.time()}
        if self.audit_code:
            record["code"] = code
        self.audit.submit({BEGIN: {"key": key, "replica": self.replica, "record": record}})
        return key

    def execution(self, *, tenant_id: str, session_id: str | None, provider: str, operation: str,
                  instance_id: str | None, language: str, code: str, duration_ms: float, status: str,
                  exit_code: int | None, memory_used_mb: float | None, error_code: str | None = None,
                  token_id: str | None = None, inflight: str | None = None) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "tenant_id": tenant_id, "session_id": session_id, "provider": provider, "operation": operation,
            "instance_id": instance_id, "language": language, "code_hash": code_hash(code),
            "duration_ms": round(duration_ms, 3), "status": status, "exit_code": exit_code,
            "memory_used_mb": memory_used_mb, "error_code": error_code, "token_id": token_id,
        }
        EXEC_LOG.info("", extra={"fields": {"timestamp": datetime.now(UTC).isoformat(), **fields}})
        if self.audit is not None:
            record = {k: v for k, v in fields.items() if k in AUDIT_FIELDS}
            record["created_at"] = time.time()  # when it happened, not when the writer got to it
            if self.audit_code:
                record["code"] = code
            if inflight:
                record[END] = inflight
            self.audit.submit(record)
        return fields
