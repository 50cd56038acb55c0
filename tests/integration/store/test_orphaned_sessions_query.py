"""``reap_orphaned``'s registry query (``SqlSessionRegistry.orphaned``) on SQLite and a real
PostgreSQL: only a dead replica's idle active rows, the longest idle first, at most a batch;
and a sweep of a service on that database that reaps them a batch at a time."""

from __future__ import annotations

import time

from execbox.service.config import ServiceSettings
from execbox.service.sessions import SessionManager
from execbox.service.store import open_store
from tests.integration.service.conftest import Holder


def _row(reg, sid: str, owner: str | None, state: str, lease_in: float | None, idle_for: float, now: float) -> None:
    reg.create("t", sid, provider="local", runtime=None, owner="x", lease_ttl=60, tenant_limit=500, global_limit=500)
    reg.update("t", sid, owner=owner, state=state, lease_expires=None if lease_in is None else now + lease_in,
               last_used=now - idle_for)


def test_orphaned_selects_only_dead_replicas_idle_active_rows(db_url, tmp_path) -> None:
    with open_store(data_dir=tmp_path, url=db_url) as store:
        reg, now = store.sessions, time.time()
        for i in range(30):
            _row(reg, f"orphan-{i:02d}", f"dead-{i % 2}", "running" if i % 5 else "creating", -30, 601 + i, now)
        _row(reg, "no-lease", "dead-0", "running", None, 599, now)  # an owner without a lease time: not live
        for i in range(40):
            _row(reg, f"live-{i:02d}", "alive", "running", 30, 600, now)
        for i in range(10):
            _row(reg, f"recent-{i}", "dead-0", "running", -30, 10, now)
            _row(reg, f"mine-{i}", "me", "running", -30, 600, now)
            _row(reg, f"paused-{i}", "dead-1", "paused", -30, 600, now)
        _row(reg, "ownerless", None, "running", -30, 600, now)
        _row(reg, "at-cutoff", "dead-1", "running", 0, 60, now)  # lease ends now, idle exactly the timeout
        assert len(reg.list()) == 103

        got = reg.orphaned("me", now, now - 60, 1000)
        expected = ([f"orphan-{i:02d}" for i in reversed(range(30))] + ["no-lease", "at-cutoff"])
        assert [r.session_id for r in got] == expected  # the longest idle first
        assert all(r.owner in ("dead-0", "dead-1") and not r.lease_live(now) for r in got)
        assert [r.session_id for r in reg.orphaned("me", now, now - 60, 5)] == expected[:5]
        assert reg.orphaned("me", now, now - 60, 0) == []
        assert [r.session_id for r in reg.orphaned("dead-1", now, now - 60, 1000)] == (  # never the caller's own
            [f"orphan-{i:02d}" for i in reversed(range(30)) if i % 2 == 0] + [f"mine-{i}" for i in range(10)]
            + ["no-lease"])


def test_a_sweep_reaps_a_batch_per_sweep_on_this_database(db_url, tmp_path, local_provider) -> None:
    with open_store(data_dir=tmp_path, url=db_url) as store:
        now = time.time()
        for i in range(5):
            _row(store.sessions, f"orphan-{i}", "dead", "running", -30, 1000 - i, now)
            _row(store.sessions, f"live-{i}", "alive", "running", 30, 1000, now)
        settings = ServiceSettings(idle_timeout=60, lease_ttl=5, replica_id="me")
        sessions = SessionManager(Holder(local_provider), settings, str(tmp_path / "ws"), None, registry=store.sessions)
        sessions.orphan_batch = 2
        try:
            assert [sessions.reap_orphaned() for _ in range(4)] == [
                [("t", "orphan-0"), ("t", "orphan-1")], [("t", "orphan-2"), ("t", "orphan-3")], [("t", "orphan-4")], []]
            assert sorted(r.session_id for r in store.sessions.list()) == [f"live-{i}" for i in range(5)]
        finally:
            sessions.shutdown()


def test_hand_back_is_conditional_on_this_database(db_url, tmp_path) -> None:
    """``hand_back`` (a failed reap returning a dead replica's row) writes only while the caller
    still holds the row: one conditional UPDATE."""
    with open_store(data_dir=tmp_path, url=db_url) as store:
        reg, now = store.sessions, time.time()
        _row(reg, "s", "me", "running", 30, 600, now)
        assert reg.hand_back("t", "s", "someone-else", "dead", now - 30) is False
        assert reg.get("t", "s").owner == "me"
        assert reg.hand_back("t", "s", "me", "dead", now - 30) is True
        row = reg.get("t", "s")
        assert row.owner == "dead" and not row.lease_live(now)
