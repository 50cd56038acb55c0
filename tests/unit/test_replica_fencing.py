"""A replica cut off from the database stops its boxes, busy ones too, before its leases run out
and another replica may take the sessions over (sessions/fence.py): two boxes on one session's
workspace (two kernels mounting one image over network storage) must never happen."""

from __future__ import annotations

import threading
import time

import pytest

from execbox.service.config import ServiceSettings
from execbox.service.sessions import SessionManager
from execbox.service.store import open_store
from tests.integration.service.conftest import Holder


@pytest.fixture
def replica(local_provider, tmp_path):
    store = open_store(tmp_path / "data")
    settings = ServiceSettings(lease_ttl=2, replica_id="ra", replica_url="http://10.0.0.1:8000")
    sessions = SessionManager(Holder(local_provider), settings, str(tmp_path / "ws"), None, registry=store.sessions)
    yield sessions, store
    sessions.shutdown()
    store.close()


def _cut_off(sessions, monkeypatch) -> None:
    def unreachable(*a, **k):
        raise ConnectionError("database unreachable")

    monkeypatch.setattr(sessions.registry, "heartbeat", unreachable)


def test_a_cut_off_replica_stops_its_boxes_busy_ones_too_before_its_lease_runs_out(
        replica, local_provider, monkeypatch) -> None:
    sessions, store = replica
    with sessions.session("t", "idle") as s:
        idle_iid = s.instance_id
    result: dict = {}

    def long_run() -> None:
        with sessions.session("t", "busy") as s:
            result["iid"] = s.instance_id
            result["r"] = local_provider.execute_code(s.instance_id, "import time; time.sleep(30)", "python", 60)

    runner = threading.Thread(target=long_run)
    runner.start()
    while "iid" not in result:
        time.sleep(0.02)
    time.sleep(0.3)  # the run is going
    _cut_off(sessions, monkeypatch)
    sessions.start()  # heartbeat (fails), fence watchdog every 0.2 s
    began = time.monotonic()
    runner.join(timeout=10)
    assert not runner.is_alive(), "the busy run went on though the replica could not renew its lease"
    assert time.monotonic() - began < 2  # well inside the 2 s lease it last wrote
    assert result["r"].metadata.get("cancelled") or result["r"].exit_code != 0
    deadline = time.monotonic() + 5
    while (local_provider.instance_alive(idle_iid) or local_provider.instance_alive(result["iid"])) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not local_provider.instance_alive(idle_iid) and not local_provider.instance_alive(result["iid"])
    assert sessions.get("t", "idle") is None and sessions.get("t", "busy") is None
    rows = {r.session_id: r for r in store.sessions.list()}
    assert set(rows) == {"idle", "busy"} and rows["busy"].owner == "ra"  # kept for whoever owns them next


def test_a_replica_that_renews_keeps_its_boxes(replica, local_provider) -> None:
    sessions, _ = replica
    with sessions.session("t", "s") as s:
        iid = s.instance_id
    sessions.start()
    time.sleep(1.5)  # past half a lease: the heartbeat renewed meanwhile
    assert sessions.fence_if_cut_off() == 0
    assert local_provider.instance_alive(iid) and sessions.get("t", "s") is not None


def test_a_single_service_never_fences(local_provider, tmp_path, monkeypatch) -> None:
    """Without EXECBOX_REPLICA_URL nobody could take its sessions over: a database hiccup must not
    cost it its boxes."""
    store = open_store(tmp_path / "data")
    sessions = SessionManager(Holder(local_provider), ServiceSettings(lease_ttl=2), str(tmp_path / "ws"), None,
                              registry=store.sessions)
    try:
        with sessions.session("t", "s") as s:
            iid = s.instance_id
        _cut_off(sessions, monkeypatch)
        sessions._renewed_at = (sessions._renewed_at[0] - 60, sessions._renewed_at[1] - 60)
        assert sessions.fence_if_cut_off() == 0 and local_provider.instance_alive(iid)
    finally:
        sessions.shutdown()
        store.close()


def test_a_wall_clock_that_moved_on_while_the_monotonic_one_did_not_fences_too(replica, local_provider) -> None:
    """A VM paused and resumed: its monotonic clock may not have moved, the wall clock (resynced,
    the one leases are judged by) did."""
    sessions, _ = replica
    with sessions.session("t", "s") as s:
        iid = s.instance_id
    mono, wall = sessions._renewed_at
    sessions._renewed_at = (mono, wall - 60)
    assert sessions.fence_if_cut_off() == 1
    deadline = time.monotonic() + 5
    while local_provider.instance_alive(iid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not local_provider.instance_alive(iid)
