"""A replica cut off from the database stops its boxes, busy ones too, before the lease it last
wrote runs out and another replica may take the sessions over (sessions/fence.py): two boxes on
one session's workspace (two kernels mounting one image over network storage) must never happen.
A healthy replica, slow or not, never fences; one whose database comes back serves its sessions
again."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from execbox.errors import ProviderUnavailableError
from execbox.service.config import ServiceSettings
from execbox.service.sessions import SessionManager
from execbox.service.store import open_store
from tests.integration.service.conftest import Holder

REPLICA = {"lease_ttl": 2, "replica_id": "ra", "replica_url": "http://10.0.0.1:8000"}


@pytest.fixture
def replica(local_provider, tmp_path):
    store = open_store(tmp_path / "data")
    sessions = SessionManager(Holder(local_provider), ServiceSettings(**REPLICA), str(tmp_path / "ws"), None,
                              registry=store.sessions)
    yield sessions, store
    sessions.shutdown()
    store.close()


def _unreachable(sessions, monkeypatch) -> None:
    def unreachable(*a, **k):
        raise ConnectionError("database unreachable")

    monkeypatch.setattr(sessions.registry, "heartbeat", unreachable)


def _lease_over(sessions, mono: float = 60, wall: float = 60) -> None:
    m, w = sessions._lease_until
    sessions._lease_until = (m - mono, w - wall)


def _gone(provider, *iids: str) -> bool:
    deadline = time.monotonic() + 5
    while any(provider.instance_alive(i) for i in iids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(provider.instance_alive(i) for i in iids)


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
    _unreachable(sessions, monkeypatch)
    sessions.start()  # its heartbeats fail; the watchdog looks every 0.13 s
    began = time.monotonic()
    runner.join(timeout=10)
    assert not runner.is_alive(), "the busy run went on though the replica could not renew its lease"
    assert time.monotonic() - began < 2  # inside the 2 s lease it last wrote
    assert result["r"].metadata.get("cancelled") or result["r"].exit_code != 0
    assert _gone(local_provider, idle_iid, result["iid"])
    assert sessions.get("t", "idle") is None and sessions.get("t", "busy") is None
    rows = {r.session_id: r for r in store.sessions.list()}
    assert set(rows) == {"idle", "busy"} and rows["busy"].owner == "ra"  # kept: whoever owns them next
    with pytest.raises(ProviderUnavailableError, match="serves no session until"):
        with sessions.session("t", "idle"):
            pass


def test_a_run_that_starts_just_after_the_fence_is_cancelled_too(replica, local_provider) -> None:
    """Its request held the session (box up, run not yet sent) when the fence's first cancel
    found nothing running: that run must not go on for its full time."""
    sessions, _ = replica
    holding, go = threading.Event(), threading.Event()
    out: dict = {}

    def request() -> None:
        with sessions.session("t", "s") as s:
            holding.set()
            go.wait()
            out["r"] = local_provider.execute_code(s.instance_id, "import time; time.sleep(4); print('done')",
                                                   "python", 60)

    th = threading.Thread(target=request)
    th.start()
    holding.wait()
    _lease_over(sessions)
    assert sessions.fence_if_cut_off() == 1
    time.sleep(0.2)  # the fence has cancelled (nothing was running yet)
    go.set()
    th.join(10)
    assert out["r"].stdout != "done\n", "a run on a fenced session ran to its end"


def test_when_the_database_answers_again_the_sessions_are_adopted_back_and_reaped_when_idle(
        replica, local_provider) -> None:
    """Fenced sessions left in the registry as this replica's and in nobody's memory were renewed
    by every heartbeat and never reaped, holding the tenant's session quota."""
    sessions, store = replica
    with sessions.session("t", "used") as s:
        local_provider.write_file(s.instance_id, "kept.txt", "files stay")
        iid = s.instance_id
    with sessions.session("t", "idle") as s:
        iid2 = s.instance_id
    _lease_over(sessions)
    assert sessions.fence_if_cut_off() == 2 and _gone(local_provider, iid, iid2)
    sessions.heartbeat()  # the database answers again
    assert sessions.get("t", "idle") is not None  # this replica's again without a request
    with sessions.session("t", "used") as s:  # served again, on a new box, files kept
        assert local_provider.read_file(s.instance_id, "kept.txt").content == "files stay"
    sessions.settings = dataclasses.replace(sessions.settings, idle_timeout=0.3)
    time.sleep(0.4)
    assert set(sessions.reap_idle()) == {("t", "idle"), ("t", "used")}  # reaped as usual, not kept for ever
    assert store.sessions.list() == []


def test_a_slow_but_successful_heartbeat_never_fences(replica, local_provider, monkeypatch) -> None:
    """Each heartbeat takes an eighth of the lease (1.9 s at the default 15 s): the leases it writes
    are always far from over, and the replica keeps its boxes."""
    sessions, store = replica
    with sessions.session("t", "s") as s:
        iid = s.instance_id
    real = store.sessions.heartbeat
    left: list[float] = []

    def slow(*a, **k):
        time.sleep(0.25)
        out = real(*a, **k)
        left.append(store.sessions.get("t", "s").lease_expires - time.time())
        return out

    monkeypatch.setattr(sessions.registry, "heartbeat", slow)
    sessions.start()
    time.sleep(3)
    assert len(left) >= 4 and min(left) > 1.5
    assert sessions.get("t", "s") is not None and local_provider.instance_alive(iid)


def test_a_slow_start_does_not_fence_the_sessions_it_adopted(local_provider, tmp_path, monkeypatch) -> None:
    store = open_store(tmp_path / "data")
    sessions = SessionManager(Holder(local_provider), ServiceSettings(**REPLICA), str(tmp_path / "ws"), None,
                              registry=store.sessions)
    try:
        with sessions.session("t", "s"):
            pass
        real = sessions.adopt_all

        def slow_adopt():
            out = real()
            time.sleep(0.8)  # (6 s at the default 15 s lease)
            return out

        monkeypatch.setattr(sessions, "adopt_all", slow_adopt)
        sessions.start()
        time.sleep(1.5)
        assert sessions.get("t", "s") is not None, "fenced right after start, the database being fine"
    finally:
        sessions.shutdown()
        store.close()


def test_a_single_service_never_fences(local_provider, tmp_path, monkeypatch) -> None:
    """Without EXECBOX_REPLICA_URL nobody could take its sessions over: a database hiccup must not
    cost it its boxes."""
    store = open_store(tmp_path / "data")
    sessions = SessionManager(Holder(local_provider), ServiceSettings(lease_ttl=2), str(tmp_path / "ws"), None,
                              registry=store.sessions)
    try:
        with sessions.session("t", "s") as s:
            iid = s.instance_id
        _unreachable(sessions, monkeypatch)
        _lease_over(sessions)
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
    _lease_over(sessions, mono=0, wall=60)
    assert sessions.fence_if_cut_off() == 1 and _gone(local_provider, iid)
