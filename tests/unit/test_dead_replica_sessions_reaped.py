"""Sessions of a replica that died are reaped by the others once idle: they counted against the
tenant's and the cluster's session limits for ever (nobody adopts a session nobody uses)."""

from __future__ import annotations

import os
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
