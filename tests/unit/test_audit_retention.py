"""The run audit keeps its rows for EXECBOX_AUDIT_DAYS (default 90; 0 keeps them all): its writer
prunes older ones, or the table would grow by every operation for as long as the service runs."""

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
    (None, ["day-1", "day-89", "now"]),  # the default, 90 days
    ("30", ["day-1", "now"]),
    ("0", ["day-1", "day-200", "day-89", "now"]),  # 0 keeps every row
])
def test_rows_older_than_the_retention_are_pruned(store, monkeypatch, days, kept):
    if days is None:
        monkeypatch.delenv("EXECBOX_AUDIT_DAYS", raising=False)
    else:
        monkeypatch.setenv("EXECBOX_AUDIT_DAYS", days)
    now = time.time()
    for age in (1, 89, 200):
        store.audit.record(tenant_id="t", operation="execute", session_id=f"day-{age}", created_at=now - age * 86400)
    _write_one(store)
    assert _rows(store) == kept
