"""The in-memory audit view is shared by every tenant of the process: when it is full, the tenant
holding the most rows loses its oldest, so one tenant's volume cannot push out the rows of a
tenant that holds less than an equal share. Found by review: one box's 25,000 rows in five
seconds left the shared FIFO holding nothing else."""

from __future__ import annotations

from execbox.egress import audit


def _rec(tenant: str, i: int) -> audit.AuditRecord:
    return audit.AuditRecord(f"box-{tenant}", "tcp", None, "203.0.113.7", 81, decision="allowed",
                             reason=f"row {i}", tenant_id=tenant)


def test_one_tenant_s_flood_does_not_push_another_tenant_s_rows_out(monkeypatch):
    monkeypatch.setattr(audit, "_views", {}, raising=False)  # a view of this test's own
    monkeypatch.setattr(audit, "_held", 0, raising=False)
    monkeypatch.setattr(audit, "_sinks", [])
    for i in range(10):
        audit.record(_rec("victim", i), counted=False)
    for i in range(25000):
        audit.record(_rec("flooder", i), counted=False)
    audit.record(_rec("victim", 10), counted=False)
    mine = audit.recent(tenant_id="victim", limit=100)
    assert [r.reason for r in mine] == [f"row {i}" for i in range(10, -1, -1)]  # all kept, newest first
    flood = audit.recent(tenant_id="flooder", limit=100000)
    assert flood[0].reason == "row 24999" and len(flood) + len(mine) == 10000  # the view's size holds
    merged = audit.recent(limit=3)  # every tenant's, newest first, in the order they were recorded
    assert [r.reason for r in merged] == ["row 10", "row 24999", "row 24998"]
