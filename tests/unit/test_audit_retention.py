"""The run audit keeps its rows for EXECBOX_AUDIT_DAYS (default 365; 0 keeps them all): its writer
prunes older ones, or the table would grow by every operation for as long as the service runs. It
deletes in batches, each its own transaction (store/retention.py)."""

import time

import pytest

from execbox.service.logs import AuditWriter
from execbox.service.store import open_store


@pytest.fixture
def store(tmp_path):
    s = open_store(data_dir=str(tmp_path))
    yield s
    s.close()


def _rows(store) -> list[str]:
    return sorted(r["session_id"] for r in store.audit.list(limit=100))


def _write_one(store) -> None:
    writer = AuditWriter(store)  # its first batch prunes
    try:
        writer.submit({"tenant_id": "t", "operation": "execute", "session_id": "now", "created_at": time.time()})
        assert writer.flush()
    finally:
        writer.close()


@pytest.mark.parametrize("days, kept", [
    (None, ["day-1", "day-200", "now"]),  # the default, 365 days
    ("30", ["day-1", "now"]),
    ("0", ["day-1", "day-200", "day-400", "now"]),  # 0 keeps every row
])
def test_rows_older_than_the_retention_are_pruned(store, monkeypatch, days, kept):
    if days is None:
        monkeypatch.delenv("EXECBOX_AUDIT_DAYS", raising=False)
    else:
        monkeypatch.setenv("EXECBOX_AUDIT_DAYS", days)
    now = time.time()
    for age in (1, 200, 400):
        store.audit.record(tenant_id="t", operation="execute", session_id=f"day-{age}", created_at=now - age * 86400)
    _write_one(store)
    assert _rows(store) == kept


def test_many_old_rows_go_in_batches(store, monkeypatch):
    from execbox.service.store import retention

    monkeypatch.setattr(retention, "PRUNE_BATCH", 7)
    now = time.time()
    for i in range(30):
        store.audit.record(tenant_id="t", operation="execute", session_id=f"old-{i:02}", created_at=now - 500 * 86400)
    store.audit.record(tenant_id="t", operation="execute", session_id="recent", created_at=now - 86400)
    assert store.audit.prune(now - 365 * 86400) == 30
    assert _rows(store) == ["recent"]
