"""A destroy leaves its row `closing` while it tears down, and a `closing` row is finished only once
its destroyer is gone: never under a destroy still running (in this process, or on a replica that
heartbeats), always once it is not. Real SessionManagers on one SQLite registry, local provider."""

from __future__ import annotations

import os
import threading
import time

import pytest
from sqlalchemy import text

from execbox.errors import ProviderUnavailableError, SessionNotFoundError
from execbox.service.config import ServiceSettings
from execbox.service.schemas import DestroyedOut
from execbox.service.sessions import SessionManager
from execbox.service.store import open_store
from tests.integration.service.conftest import Holder


def _manager(provider, tmp_path, store, replica: str, **kw) -> SessionManager:
    settings = ServiceSettings(idle_timeout=60, lease_ttl=5, replica_id=replica, **kw)
    return SessionManager(Holder(provider), settings, str(tmp_path / "ws"), None, registry=store.sessions)


def _with_file(sessions: SessionManager, provider, sid: str) -> str:
    with sessions.session("t1", sid) as s:
        provider.write_file(s.instance_id, "f.txt", "x")
        return s.workspace


def test_every_destroy_writes_closing_before_it_tears_down_and_deletes_the_row_last(
        local_provider, tmp_path, monkeypatch) -> None:
    """So a kill during the teardown leaves a row that says what was under way (admin DELETE, the
    idle reaper, and a destroy of an unloaded session alike)."""
    store = open_store(tmp_path / "data")
    sessions = _manager(local_provider, tmp_path, store, "me")
    seen: list[tuple[str, str | None]] = []

    def spy(name, real):
        def wrapped(x, *a, **k):
            sid = x.session_id
            seen.append((sid, store.sessions.get("t1", sid).state))
            return real(x, *a, **k)
        monkeypatch.setattr(sessions, name, wrapped)

    spy("_teardown", sessions._teardown)
    spy("_remove_remnants", sessions._remove_remnants)
    try:
        for sid in ("deleted", "idle", "paused"):
            _with_file(sessions, local_provider, sid)
        sessions.pause("t1", "paused")
        sessions._sessions.pop(("t1", "paused"))  # as after a restart: not loaded here
        sessions.get("t1", "idle").last_used = time.monotonic() - 600
        assert sessions.destroy("t1", "deleted")["state"] == "closed"
        assert sessions.reap_idle() == [("t1", "idle")]
        out = sessions.destroy("t1", "paused")
        assert seen == [("deleted", "closing"), ("idle", "closing"), ("paused", "closing")]
        assert store.sessions.list() == []
        # the unloaded one answers the same object as a loaded one (the route's response model)
        assert DestroyedOut.model_validate({"destroyed": out}).destroyed.state == "closed"
        assert out["instance_id"] is None and out["owner"] == "me" and out["session_id"] == "paused"
    finally:
        sessions.shutdown()
        store.close()


def test_a_destroy_in_flight_is_left_alone_and_one_cut_off_is_finished(local_provider, tmp_path,
                                                                         monkeypatch) -> None:
    store = open_store(tmp_path / "data")
    ra = _manager(local_provider, tmp_path, store, "ra")
    rb = _manager(local_provider, tmp_path, store, "rb")
    release, tearing = threading.Event(), threading.Event()
    real_teardown = ra._teardown

    def slow_teardown(s, *a, **k):
        tearing.set()
        assert release.wait(30)
        return real_teardown(s, *a, **k)

    monkeypatch.setattr(ra, "_teardown", slow_teardown)
    try:
        ws = _with_file(ra, local_provider, "s")
        ra.heartbeat()  # ra's replica row: it is alive
        destroyer = threading.Thread(target=ra.destroy, args=("t1", "s"))
        destroyer.start()
        assert tearing.wait(30)
        store.sessions.update("t1", "s", expires_at=time.time() - 1)  # as if it had torn down for a lease
        # not finished under its live destroyer: by this replica's sweep, nor another's, nor a request
        assert ra.expire() == [] and rb.expire() == []
        for m in (ra, rb):
            with pytest.raises(ProviderUnavailableError, match="being destroyed"):
                with m.session("t1", "s"):
                    pass
            with pytest.raises(ProviderUnavailableError, match="being destroyed"):
                m.destroy("t1", "s")
        assert store.sessions.get("t1", "s").state == "closing" and os.path.exists(ws)
        release.set()
        destroyer.join(30)
        assert store.sessions.get("t1", "s") is None and not os.path.exists(ws)

        # cut off: ra "restarts" (a new process of the same replica: no destroy of it runs there)
        release.clear()
        ws = _with_file(ra, local_provider, "s2")
        ra._sessions.pop(("t1", "s2"))
        store.sessions.update("t1", "s2", state="closing", expires_at=time.time() - 1)
        ra.heartbeat()
        assert rb.expire() == []  # ra's row, and ra heartbeats: ra's to finish
        ra_again = _manager(local_provider, tmp_path, store, "ra")
        assert ra_again.expire() == [("t1", "s2")]
        assert store.sessions.get("t1", "s2") is None and not os.path.exists(ws)
        ra_again.shutdown()
    finally:
        release.set()
        for m in (ra, rb):
            m.shutdown()
        store.close()


def test_a_dead_replicas_cut_off_destroy_is_finished_by_one_other_replica(local_provider, tmp_path) -> None:
    store = open_store(tmp_path / "data")
    dead = _manager(local_provider, tmp_path, store, "dead")
    others = [_manager(local_provider, tmp_path, store, r) for r in ("ra", "rb")]
    try:
        ws = _with_file(dead, local_provider, "s")
        dead.heartbeat()
        dead._sessions.clear()  # it dies during the destroy of "s"
        store.sessions.update("t1", "s", state="closing", expires_at=time.time() - 1)
        assert [m.expire() for m in others] == [[], []]  # its heartbeat is fresh: it may be tearing down
        with pytest.raises(ProviderUnavailableError):
            with others[0].session("t1", "s"):
                pass
        with store.engine.begin() as conn:
            conn.execute(text("UPDATE replicas SET heartbeat = :t WHERE id = 'dead'"), {"t": time.time() - 6})
            conn.execute(text("UPDATE sessions SET lease_expires = :t"), {"t": time.time() - 1})
        barrier = threading.Barrier(2)
        results: dict[str, list] = {}

        def sweep(m: SessionManager) -> None:
            barrier.wait()
            results[m.replica] = m.expire()

        threads = [threading.Thread(target=sweep, args=(m,)) for m in others]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results["ra"] + results["rb"]) == [("t1", "s")]  # one of them finished it
        assert store.sessions.get("t1", "s") is None and not os.path.exists(ws)
        with pytest.raises(SessionNotFoundError):
            others[0].destroy("t1", "s")
    finally:
        for m in (dead, *others):
            m.shutdown()
        store.close()


def test_a_teardown_that_fails_leaves_the_row_closing_and_a_later_sweep_finishes_it(
        local_provider, tmp_path, monkeypatch) -> None:
    from execbox.service.sessions import admin

    store = open_store(tmp_path / "data")
    sessions = _manager(local_provider, tmp_path, store, "me")
    monkeypatch.setattr(admin, "FINISH_RETRY", 0.3)
    try:
        ws = _with_file(sessions, local_provider, "s")
        calls = {"n": 0}
        real = admin.remove_workspace

        def fails_twice(path, proceed=None):
            calls["n"] += 1
            if calls["n"] <= 2:
                raise OSError("device busy")
            return real(path, proceed)

        monkeypatch.setattr(admin, "remove_workspace", fails_twice)
        with pytest.raises(OSError):
            sessions.destroy("t1", "s")
        assert store.sessions.get("t1", "s").state == "closing"
        store.sessions.update("t1", "s", expires_at=time.time() - 1)
        assert sessions.expire() == []  # fails again: tried after FINISH_RETRY, not every sweep
        assert sessions.expire() == [] and calls["n"] == 2
        time.sleep(0.35)
        assert sessions.expire() == [("t1", "s")]
        assert store.sessions.get("t1", "s") is None and not os.path.exists(ws)
    finally:
        sessions.shutdown()
        store.close()


@pytest.mark.parametrize("how", ["claimed by another replica", "fenced"])
def test_a_destroy_no_longer_this_replicas_leaves_the_workspace_and_row_to_its_finisher(
        local_provider, tmp_path, monkeypatch, how) -> None:
    """A replica cut off during its destroy is a lease late for the others, and one of them finishes
    the destroy and may start a new session of the name: the late destroyer must then delete
    neither that workspace nor that row."""
    store = open_store(tmp_path / "data")
    ra = _manager(local_provider, tmp_path, store, "ra")
    release, tearing = threading.Event(), threading.Event()
    real_destroy_instance = ra._destroy_instance

    def slow(*a, **k):  # the box's teardown, before the workspace's
        tearing.set()
        assert release.wait(30)
        return real_destroy_instance(*a, **k)

    monkeypatch.setattr(ra, "_destroy_instance", slow)
    try:
        ws = _with_file(ra, local_provider, "s")
        destroyer = threading.Thread(target=ra.destroy, args=("t1", "s"))
        destroyer.start()
        assert tearing.wait(30)
        if how == "fenced":
            ra._fenced = True
        else:
            store.sessions.update("t1", "s", owner="rb", lease_expires=time.time() + 60)
        release.set()
        destroyer.join(30)
        row = store.sessions.get("t1", "s")
        assert row is not None and row.state == "closing" and os.path.exists(ws)
        assert row.owner == ("ra" if how == "fenced" else "rb")
        ra._fenced = False
        if how == "fenced":  # back in touch: its own sweep finishes it
            store.sessions.update("t1", "s", expires_at=time.time() - 1)
            assert ra.expire() == [("t1", "s")]
            assert store.sessions.get("t1", "s") is None and not os.path.exists(ws)
    finally:
        release.set()
        ra.shutdown()
        store.close()
