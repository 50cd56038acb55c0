"""A box cannot grow the audit without bound: refused DNS names past 20 a second are counted and
summed up in one row; rows older than the retention are pruned."""

from __future__ import annotations

import asyncio
import time

from dnslib import DNSRecord
from sqlalchemy.orm import sessionmaker

from execbox.egress import audit, box_dns
from execbox.egress import gateway as gw
from execbox.egress.policy import parse_policy


def test_dns_denials_past_the_rate_are_counted_not_recorded_one_by_one():
    d = audit.RowBudget(per_second=3)
    assert [d.admit(10.0) for _ in range(5)] == [(True, 0)] * 3 + [(False, 0)] * 2
    assert d.admit(10.5) == (False, 0)
    assert d.admit(11.0) == (True, 3)  # the next second sums up the three held back
    assert d.admit(11.1) == (True, 0) and d.drain() == 0


def test_a_box_flooding_its_resolver_gets_bounded_rows_and_exact_counts(monkeypatch):
    rows: list[audit.AuditRecord] = []
    real_count = audit.count_only

    def record(rec: audit.AuditRecord, counted: bool = True) -> None:  # the ring, without the SQL sinks
        rows.append(rec)
        if counted:
            real_count(rec.kind, rec.decision)

    monkeypatch.setattr(gw.audit, "record", record)
    link = gw.BoxLink("flood", parse_policy("allowlist", ["api.example.com"]), gw.Limits(), None, None)
    link.dns_denials.clock = lambda: 100.0  # one second, however slow this machine is
    dns = box_dns.BoxDns(link)

    class T:
        def is_closing(self) -> bool:
            return False

        def sendto(self, data, addr) -> None:  # noqa: ANN001
            pass

    dns.transport = T()  # type: ignore[assignment]
    before = audit.counts().get(("dns", "denied"), 0)

    async def flood() -> None:
        for i in range(500):
            await dns._answer(DNSRecord.question(f"n{i}.evil.test").pack(), ("10.0.0.2", 5353))

    asyncio.run(flood())
    assert len(rows) == 20 and all(r.host and r.host.endswith(".evil.test") for r in rows)
    assert audit.counts()[("dns", "denied")] - before == 500  # the held-back ones counted too, for the metrics
    link.summarize_dns_denials(link.dns_denials.drain())  # the box goes (Gateway._detach)
    assert rows[-1].host is None and rows[-1].reason.startswith("480 more names not allowed")
    assert audit.counts()[("dns", "denied")] - before == 500  # the summing-up row is no attempt of its own


def test_audit_rows_older_than_the_retention_are_pruned(tmp_path, monkeypatch):
    from execbox.service.store import open_store
    from execbox.service.store.egress_store import EgressAuditRepo, EgressAuditWriter

    store = open_store(data_dir=str(tmp_path))
    repo = EgressAuditRepo(sessionmaker(store.engine, expire_on_commit=False))
    now = time.time()
    repo.insert_many([audit.AuditRecord("b", "tcp", "old.example", None, 443, ts=now - 40 * 86400),
                      audit.AuditRecord("b", "tcp", "new.example", None, 443, ts=now - 86400)])
    monkeypatch.setenv("EXECBOX_EGRESS_AUDIT_DAYS", "30")
    writer = EgressAuditWriter(repo)  # its first batch prunes
    try:
        writer(audit.AuditRecord("b", "dns", "x.example", None, None))
        writer.flush()
        assert sorted(r["host"] for r in repo.list()) == ["new.example", "x.example"]
    finally:
        writer.close()
        store.close()


def test_records_the_store_never_got_are_counted_and_flush_never_hangs(tmp_path):
    from execbox.service.store.egress_store import EgressAuditWriter

    class Down:
        def insert_many(self, records):  # noqa: ANN001, ANN201
            raise RuntimeError("database is down")

        def prune(self, older_than):  # noqa: ANN001, ANN201
            raise RuntimeError("database is down")

    writer = EgressAuditWriter(Down())  # type: ignore[arg-type]
    try:
        for _ in range(3):
            writer(audit.AuditRecord("b", "tcp", "x.example", None, 443))
        writer.flush(5)
        assert writer.dropped == 3
    finally:
        writer.close()
    stuck = EgressAuditWriter.__new__(EgressAuditWriter)  # a writer whose queue is full and never drains
    import queue as q

    stuck._q = q.Queue(maxsize=1)
    stuck._q.put_nowait(None)
    started = time.monotonic()
    stuck.flush(0.3)
    assert time.monotonic() - started < 5  # returned after its timeout instead of blocking on the full queue
