"""Sessions of a replica that died are reaped by the others once idle: they counted against the
tenant's and the cluster's session limits for ever (nobody adopts a session nobody uses)."""

from __future__ import annotations

import os
import threading
import time

from execbox.errors import RateLimitError
from execbox.service.config import ServiceSettings
from execbox.service.sessions import SessionManager
from execbox.service.store import open_store
from tests.integration.service.conftest import Holder


def _orphan(store, session_id: str, idle_for: float) -> None:
    """A row as a dead replica leaves it: running, its lease run out, last used ``idle_for`` ago."""
    store.sessions.create("t1", session_id, provider="local", runtime=None, owner="dead-replica", lease_ttl=0.01,
                          tenant_limit=10, global_limit=10)
    store.sessions.update("t1", session_id, state="running", last_used=time.time() - idle_for)


def test_idle_sessions_of_a_dead_replica_are_reaped_and_free_their_quota(local_provider, tmp_path) -> None:
    store = open_store(tmp_path / "data")
    settings = ServiceSettings(idle_timeout=60, tenant_max_sessions=2, lease_ttl=5)
    sessions = SessionManager(Holder(local_provider), settings, str(tmp_path / "ws"), None, registry=store.sessions)
    try:
        _orphan(store, "old-1", idle_for=600)
        _orphan(store, "old-2", idle_for=600)
        ws = sessions.record_workspace(store.sessions.get("t1", "old-1"))
        os.makedirs(ws)
        open(os.path.join(ws, "f.txt"), "w").close()
        time.sleep(0.05)  # both leases are over
        try:
            with sessions.session("t1", "new"):
                raise AssertionError("the tenant's limit of 2 is held by the dead replica's sessions")
        except RateLimitError:
            pass
        _orphan(store, "recent", idle_for=1)  # (a third row: created past the limit directly)
        assert sorted(sessions.reap_orphaned()) == [("t1", "old-1"), ("t1", "old-2")]
        assert store.sessions.get("t1", "old-1") is None and not os.path.exists(ws)
        assert store.sessions.get("t1", "recent") is not None  # not idle yet: adopted on use, or reaped later
        with sessions.session("t1", "new") as s:
            assert s.instance_id
    finally:
        sessions.shutdown()
        store.close()


def test_an_idle_session_taken_over_elsewhere_is_let_go_not_reaped(local_provider, tmp_path) -> None:
    """A replica cut off from the database (its lease ran out, another replica took the session
    over) must not reap the session as its own idle one: that deleted the new owner's row and the
    workspace it was using. It stops its own box and leaves both to the owner."""
    store = open_store(tmp_path / "data")
    settings = ServiceSettings(idle_timeout=60, lease_ttl=5)
    sessions = SessionManager(Holder(local_provider), settings, str(tmp_path / "ws"), None, registry=store.sessions)
    try:
        with sessions.session("t1", "s") as s:
            local_provider.write_file(s.instance_id, "f.txt", "the owner's")
            ws, iid = s.workspace, s.instance_id
        store.sessions.update("t1", "s", owner="rb", lease_expires=time.time() + 60)  # taken over meanwhile
        s.last_used = time.monotonic() - 600
        assert sessions.reap_idle() == []
        assert sessions.get("t1", "s") is None and not local_provider.instance_alive(iid)  # let go here
        row = store.sessions.get("t1", "s")
        assert row is not None and row.owner == "rb"
        assert open(os.path.join(ws, "f.txt")).read() == "the owner's"
    finally:
        sessions.shutdown()
        store.close()


class _Spy:
    """The registry, recording which of its reads a sweep made and what they returned."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.calls: list[tuple[str, list]] = []

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if name not in ("list", "orphaned"):
            return attr

        def read(*args, **kwargs):
            rows = attr(*args, **kwargs)
            self.calls.append((name, [(r.tenant_id, r.session_id) for r in rows]))
            return rows
        return read


def _row(store, session_id: str, *, owner: str | None, lease_in: float, idle_for: float,
         state: str = "running") -> None:
    """A registry row as some replica left it: ``lease_in`` seconds of lease left (negative: over)."""
    store.sessions.create("t1", session_id, provider="local", runtime=None, owner=owner or "x", lease_ttl=60,
                          tenant_limit=1000, global_limit=1000)
    now = time.time()
    store.sessions.update("t1", session_id, state=state, owner=owner, lease_expires=now + lease_in,
                          last_used=now - idle_for)


def test_a_sweep_reads_only_the_orphaned_rows_not_the_whole_registry(local_provider, tmp_path) -> None:
    """With many sessions across replicas, the sweep asks the registry for the dead replicas'
    idle sessions only (one bounded query), not every row to filter here."""
    store = open_store(tmp_path / "data")
    settings = ServiceSettings(idle_timeout=60, lease_ttl=5, replica_id="me")
    spy = _Spy(store.sessions)
    sessions = SessionManager(Holder(local_provider), settings, str(tmp_path / "ws"), None, registry=spy)
    try:
        orphans = [f"orphan-{i:02d}" for i in range(12)]
        for i, sid in enumerate(orphans):
            _row(store, sid, owner=f"dead-{i % 3}", lease_in=-30, idle_for=600 + i)
        _row(store, "no-lease-time", owner="dead-0", lease_in=-30, idle_for=600, state="creating")
        store.sessions.update("t1", "no-lease-time", lease_expires=None)  # an owner, no lease: not live
        orphans.append("no-lease-time")
        for i in range(15):  # a live replica's idle sessions: its owner reaps them
            _row(store, f"live-{i:02d}", owner="alive", lease_in=30, idle_for=600)
        for i in range(5):  # a dead replica's, but used recently: adopted on use, reaped later
            _row(store, f"recent-{i}", owner="dead-1", lease_in=-30, idle_for=5)
        for i in range(4):  # this replica's own rows (its reap_idle's business)
            _row(store, f"mine-{i}", owner="me", lease_in=-30, idle_for=600)
        for i in range(4):  # a dead replica's paused ones (expire() deletes them when their retention ends)
            _row(store, f"paused-{i}", owner="dead-2", lease_in=-30, idle_for=600, state="paused")
        _row(store, "ownerless", owner=None, lease_in=-30, idle_for=600)
        before = {(r.session_id, r.state, r.owner) for r in store.sessions.list()}
        assert len(before) == 42
        spy.calls.clear()

        reaped = sessions.reap_orphaned()

        assert [name for name, _ in spy.calls] == ["orphaned"]  # no read of the whole table
        assert sorted(spy.calls[0][1]) == sorted(("t1", s) for s in orphans)
        assert sorted(reaped) == sorted(("t1", s) for s in orphans)
        after = {(r.session_id, r.state, r.owner) for r in store.sessions.list()}
        assert after == {row for row in before if row[0] not in orphans}  # nothing else touched
    finally:
        sessions.shutdown()
        store.close()


def test_one_sweep_reaps_at_most_a_batch_and_the_next_sweep_goes_on(local_provider, tmp_path) -> None:
    store = open_store(tmp_path / "data")
    settings = ServiceSettings(idle_timeout=60, lease_ttl=5, replica_id="me")
    spy = _Spy(store.sessions)
    sessions = SessionManager(Holder(local_provider), settings, str(tmp_path / "ws"), None, registry=spy)
    sessions.orphan_batch = 3
    try:
        for i in range(7):  # orphan-0 has been idle longest
            _row(store, f"orphan-{i}", owner="dead", lease_in=-30, idle_for=1000 - i)
        for i in range(3):
            _row(store, f"live-{i}", owner="alive", lease_in=30, idle_for=5000)
        sweeps = [sessions.reap_orphaned() for _ in range(4)]
        assert sweeps == [[("t1", f"orphan-{i}") for i in range(0, 3)], [("t1", f"orphan-{i}") for i in range(3, 6)],
                          [("t1", "orphan-6")], []]
        assert all(len(rows) <= 3 for _, rows in spy.calls)
        assert sorted(r.session_id for r in store.sessions.list()) == ["live-0", "live-1", "live-2"]
    finally:
        sessions.shutdown()
        store.close()


def test_two_replicas_sweeping_together_reap_each_orphan_once(local_provider, tmp_path) -> None:
    """Both replicas' queries select the same rows; the conditional claim lets one of them reap each."""
    store = open_store(tmp_path / "data")
    managers = [SessionManager(Holder(local_provider), ServiceSettings(idle_timeout=60, lease_ttl=5, replica_id=r),
                               str(tmp_path / "ws"), None, registry=store.sessions) for r in ("ra", "rb")]
    try:
        for i in range(20):
            _row(store, f"orphan-{i:02d}", owner="dead", lease_in=-30, idle_for=600)
        barrier = threading.Barrier(2)
        results: dict[str, list[tuple[str, str]]] = {}

        def sweep(m: SessionManager) -> None:
            barrier.wait()
            results[m.replica] = m.reap_orphaned()

        threads = [threading.Thread(target=sweep, args=(m,)) for m in managers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        together = results["ra"] + results["rb"]
        assert sorted(together) == [("t1", f"orphan-{i:02d}") for i in range(20)]  # each once, none twice
        assert store.sessions.list() == []
    finally:
        for m in managers:
            m.shutdown()
        store.close()


def test_the_memory_registry_selects_what_the_sql_one_does(tmp_path) -> None:
    """``orphaned`` is part of the registry contract: the in-memory registry answers it alike."""
    from execbox.service.sessions.registry import MemoryRegistry

    store = open_store(tmp_path / "data")
    mem = MemoryRegistry()
    now = time.time()
    try:
        rows = [("a", "dead", "running", -30, 600), ("b", "dead", "creating", -30, 700),
                ("c", "alive", "running", 30, 600), ("d", "dead", "running", -30, 5), ("e", "me", "running", -30, 600),
                ("f", "dead", "paused", -30, 600), ("g", None, "running", -30, 600), ("h", "dead", "running", -30, 800)]
        for reg in (store.sessions, mem):
            for sid, owner, state, lease_in, idle_for in rows:
                reg.create("t", sid, provider=None, runtime=None, owner="x", lease_ttl=60, tenant_limit=99,
                           global_limit=99)
                reg.update("t", sid, owner=owner, state=state, lease_expires=now + lease_in, last_used=now - idle_for)
        for limit in (0, 1, 2, 10):
            sql = [r.session_id for r in store.sessions.orphaned("me", now, now - 60, limit)]
            assert sql == [r.session_id for r in mem.orphaned("me", now, now - 60, limit)]
            assert sql == ["h", "b", "a"][:limit]
    finally:
        store.close()


def test_a_reap_that_fails_hands_the_session_back_for_a_later_sweep(local_provider, tmp_path, monkeypatch) -> None:
    """Claimed and then not reaped (its box or workspace could not be removed), the row stayed
    this replica's: the heartbeat renewed its lease for ever and no sweep tried it again. Now it
    is handed back, and this replica tries it again after REAP_RETRY."""
    from execbox.service.sessions import lifecycle

    store = open_store(tmp_path / "data")
    settings = ServiceSettings(idle_timeout=60, lease_ttl=5)
    sessions = SessionManager(Holder(local_provider), settings, str(tmp_path / "ws"), None, registry=store.sessions)
    monkeypatch.setattr(lifecycle, "REAP_RETRY", 0.3)
    try:
        _orphan(store, "stuck", idle_for=600)
        time.sleep(0.05)
        real = sessions.destroy_unloaded

        def fails(*a, **k):
            raise OSError("workspace busy")

        monkeypatch.setattr(sessions, "destroy_unloaded", fails)
        assert sessions.reap_orphaned() == []
        sessions.heartbeat()  # renews only what this replica owns
        row = store.sessions.get("t1", "stuck")
        assert row.owner == "dead-replica" and not row.lease_live(time.time())
        monkeypatch.setattr(sessions, "destroy_unloaded", real)
        assert sessions.reap_orphaned() == []  # waits its turn
        time.sleep(0.35)
        assert sessions.reap_orphaned() == [("t1", "stuck")]
        assert store.sessions.get("t1", "stuck") is None
    finally:
        sessions.shutdown()
        store.close()


def test_rows_whose_reap_fails_do_not_starve_the_others(local_provider, tmp_path, monkeypatch) -> None:
    """Handed back with their old last-used time, failing rows head every batch: with a batch of
    2 and two rows that always fail, a third orphan was never reached."""
    store = open_store(tmp_path / "data")
    sessions = SessionManager(Holder(local_provider), ServiceSettings(idle_timeout=60, lease_ttl=5),
                              str(tmp_path / "ws"), None, registry=store.sessions)
    sessions.orphan_batch = 2
    try:
        _orphan(store, "stuck-a", 900)
        _orphan(store, "stuck-b", 800)
        _orphan(store, "fine", 700)
        time.sleep(0.05)
        real = sessions.destroy_unloaded

        def destroy(t, sid):
            if sid.startswith("stuck"):
                raise OSError("workspace busy")
            return real(t, sid)

        monkeypatch.setattr(sessions, "destroy_unloaded", destroy)
        sweeps = [sessions.reap_orphaned() for _ in range(3)]
        assert sum(sweeps, []) == [("t1", "fine")]
    finally:
        sessions.shutdown()
        store.close()


def test_a_failed_reap_never_hands_away_a_session_a_request_made_ours_meanwhile(
        local_provider, tmp_path, monkeypatch) -> None:
    """While the reap ran, the row was ours, and a request (forwarded here) adopted it and started
    a box; handing the row back to the dead owner then would let another replica reap it (its
    workspace included) under this replica's live box."""
    store = open_store(tmp_path / "data")
    sessions = SessionManager(Holder(local_provider), ServiceSettings(idle_timeout=60, lease_ttl=5, replica_id="me"),
                              str(tmp_path / "ws"), None, registry=store.sessions)
    try:
        _orphan(store, "s", idle_for=900)
        time.sleep(0.05)

        def destroy(t, sid):
            with sessions.session(t, sid):  # the concurrent request
                pass
            raise OSError("container removal failed")

        monkeypatch.setattr(sessions, "destroy_unloaded", destroy)
        assert sessions.reap_orphaned() == []
        assert sessions.get("t1", "s") is not None and store.sessions.get("t1", "s").owner == "me"
    finally:
        sessions.shutdown()
        store.close()


def test_hand_back_writes_only_while_the_row_is_still_the_callers(tmp_path) -> None:
    store = open_store(tmp_path / "data")
    try:
        _orphan(store, "s", idle_for=900)
        reg = store.sessions
        assert reg.hand_back("t1", "s", "someone-else", "x", None) is False
        assert reg.get("t1", "s").owner == "dead-replica"
        assert reg.hand_back("t1", "s", "dead-replica", "me", 5.0) is True
        assert (reg.get("t1", "s").owner, reg.get("t1", "s").lease_expires) == ("me", 5.0)
    finally:
        store.close()
