"""Kubernetes sessions across restarts, crashes and dead replicas, as Docker ones (providers/
kubernetes_handover.py): the session manager on a shared SQL registry over providers against the
in-test API server, whose pods are real containers. A graceful restart detaches from the session's
pod and the next start reconnects with the interpreter state intact; after a crash the restart
re-attaches to the same pod (no second one); a dead replica's session destroyed or reaped takes its
pod along; a pod marked for this registry that no row names is removed, others are kept."""

from __future__ import annotations

import time

import pytest

from execbox.boxes import k8s_spec as ks
from execbox.service.config import ServiceSettings
from execbox.service.sessions import SessionManager
from execbox.service.store import open_store
from tests.integration.service.conftest import Holder

from .conftest import pod_of

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]


def _wait(cond, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _manager(store, provider, replica: str, ws: str, **settings) -> SessionManager:
    return SessionManager(Holder(provider), ServiceSettings(replica_id=replica, drain_timeout=5, **settings), ws,
                          None, registry=store.sessions)


def _run(sessions: SessionManager, code: str, session: str = "s"):
    with sessions.session("t1", session) as s:
        return s.provider.execute_code(s.instance_id, code, "python", context_id="c"), s


def _session_pods(fake, session: str) -> list[str]:
    return [n for n in fake.pod_names()
            if ((fake.pod(n) or {}).get("metadata", {}).get("annotations") or {}).get(ks.A_SESSION) == session]


def _crash(provider) -> None:
    """The replica's process dies: its agent connections drop, its sweeper stops, no pod is deleted."""
    provider._stop.set()
    with provider._lock:
        insts = list(provider._instances.values())
        provider._instances.clear()
    for inst in insts:
        inst.box.destroyed = True
        inst.box.client.close()


def _box_id(store, session: str = "s") -> str:
    return store.sessions.get("t1", session).box_handle.get("box_id", "")


def test_a_graceful_restart_keeps_the_pod_and_the_interpreter_state(k8s_provider_factory, fake_apiserver,
                                                                    tmp_path) -> None:
    store = open_store(tmp_path / "data")
    p1 = k8s_provider_factory()
    m1 = _manager(store, p1, "r1", str(tmp_path / "ws"))
    m1.start()
    try:
        r, _ = _run(m1, "x = 41")
        assert r.exit_code == 0, r
        [pod] = _session_pods(fake_apiserver, "s")
        m1.shutdown()  # SIGTERM: the session is parked, its pod left running
        p1.shutdown()
        assert _session_pods(fake_apiserver, "s") == [pod]
        p2 = k8s_provider_factory()
        m2 = _manager(store, p2, "r1", str(tmp_path / "ws"))
        m2.start()
        r, s = _run(m2, "print(x + 1)")
        assert r.stdout == "42\n" and not s.contexts_lost, r
        assert _session_pods(fake_apiserver, "s") == [pod] and _box_id(store) == pod
        m2.destroy("t1", "s")
        _wait(lambda: not _session_pods(fake_apiserver, "s"), 15, "the destroyed session's pod deletion")
        m2.shutdown()
    finally:
        store.close()


def test_a_restart_after_a_crash_reattaches_the_same_pod(k8s_provider_factory, fake_apiserver, tmp_path) -> None:
    store = open_store(tmp_path / "data")
    p1 = k8s_provider_factory()
    m1 = _manager(store, p1, "r1", str(tmp_path / "ws"))  # never started nor shut down: it crashes
    try:
        assert _run(m1, "x = 41")[0].exit_code == 0
        [pod] = _session_pods(fake_apiserver, "s")
        _crash(p1)
        p2 = k8s_provider_factory()
        m2 = _manager(store, p2, "r1", str(tmp_path / "ws"))
        m2.start()  # re-adopts its own rows: the pod is found by its handle and reconnected
        r, s = _run(m2, "print(x + 1)")
        assert r.stdout == "42\n" and not s.contexts_lost, r
        assert _session_pods(fake_apiserver, "s") == [pod] and _box_id(store) == pod  # no second pod
        m2.destroy("t1", "s")
        _wait(lambda: not _session_pods(fake_apiserver, "s"), 15, "the destroyed session's pod deletion")
        m2.shutdown()
    finally:
        store.close()


def test_a_replica_takes_a_session_over_and_the_old_owner_lets_go_of_the_pod(k8s_provider_factory,
                                                                             fake_apiserver, tmp_path) -> None:
    store = open_store(tmp_path / "data")
    p1, p2 = k8s_provider_factory(), k8s_provider_factory()
    m1 = _manager(store, p1, "ra", str(tmp_path / "ws"), lease_ttl=1)
    m2 = _manager(store, p2, "rb", str(tmp_path / "ws"), lease_ttl=1)
    try:
        assert _run(m1, "x = 41")[0].exit_code == 0
        [pod] = _session_pods(fake_apiserver, "s")
        time.sleep(1.5)  # ra could not renew its lease (cut off, frozen)
        r, s = _run(m2, "print(x + 1)")  # rb takes the session over: the same pod, its contexts
        assert r.stdout == "42\n" and not s.contexts_lost, r
        m1.heartbeat()  # ra finds the session taken over: it lets go, and must leave the pod
        assert m1.get("t1", "s") is None
        assert _run(m2, "print(x + 2)")[0].stdout == "43\n"
        assert _session_pods(fake_apiserver, "s") == [pod]
        m2.destroy("t1", "s")
        _wait(lambda: not _session_pods(fake_apiserver, "s"), 15, "the destroyed session's pod deletion")
    finally:
        m2.shutdown()
        m1.shutdown()
        store.close()


def test_a_dead_replicas_sessions_take_their_pods_when_destroyed_or_reaped(k8s_provider_factory, fake_apiserver,
                                                                           tmp_path) -> None:
    store = open_store(tmp_path / "data")
    p1 = k8s_provider_factory()
    m1 = _manager(store, p1, "ra", str(tmp_path / "ws"), lease_ttl=1)
    try:
        _run(m1, "x = 1", "s")
        _run(m1, "x = 2", "idle")
        pods = {name: _session_pods(fake_apiserver, name) for name in ("s", "idle")}
        assert all(len(v) == 1 for v in pods.values()), pods
        _crash(p1)
        time.sleep(1.5)  # ra's leases run out
        p2 = k8s_provider_factory()
        m2 = _manager(store, p2, "rb", str(tmp_path / "ws"), lease_ttl=1, idle_timeout=1)
        m2.destroy("t1", "s")  # an admin deletes the dead replica's session
        _wait(lambda: pods["s"][0] not in fake_apiserver.pod_names(), 15, "the destroyed session's pod deletion")
        assert ("t1", "idle") in m2.reap_orphaned()  # the sweep reaps its idle one
        assert store.sessions.get("t1", "idle") is None
        _wait(lambda: pods["idle"][0] not in fake_apiserver.pod_names(), 15, "the reaped session's pod deletion")
        m2.shutdown()
    finally:
        store.close()


def test_orphan_pods_of_this_registry_are_removed_and_known_ones_kept(k8s_provider_factory, fake_apiserver,
                                                                      tmp_path) -> None:
    store = open_store(tmp_path / "data")
    p1 = k8s_provider_factory()
    m1 = _manager(store, p1, "r1", str(tmp_path / "ws"))
    try:
        _run(m1, "x = 1", "known")
        known = _box_id(store, "known")
        _run(m1, "x = 0", "ghost")  # its row goes (as if deleted while the replica was down)
        [ghost_pod] = _session_pods(fake_apiserver, "ghost")
        store.sessions.delete("t1", "ghost")
        # session pods no row names that are not this registry's: another registry's, and unmarked
        other = p1.create_instance(tenant_id="t1", session_id="other").instance_id
        p1.api.patch_pod(pod_of(fake_apiserver, other)["metadata"]["name"], {"metadata": {"annotations": {
            "execbox.dev/registry": "/var/lib/execbox/workspaces/another-db", "execbox.dev/registered-at": "1"}}})
        unmarked = p1.create_instance(tenant_id="t1", session_id="unmarked").instance_id
        _wait(lambda: "execbox.dev/registry" in (fake_apiserver.pod(ghost_pod) or {}).get("metadata", {}).get(
            "annotations", {}), 15, "the registry mark")
        _crash(p1)
        p2 = k8s_provider_factory()
        m2 = _manager(store, p2, "r1", str(tmp_path / "ws"))
        m2.start()  # within orphan_grace of its marking: a session being created, kept
        assert ghost_pod in fake_apiserver.pod_names()
        p2.orphan_grace = 0
        m2.adopt_all()
        _wait(lambda: ghost_pod not in fake_apiserver.pod_names(), 15, "the orphan's deletion")
        assert known in fake_apiserver.pod_names()
        assert pod_of(fake_apiserver, other) is not None and pod_of(fake_apiserver, unmarked) is not None
        assert _run(m2, "print(x)", "known")[0].stdout == "1\n"  # the known one was re-attached
        for iid in (other, unmarked):  # not this registry's: removed by hand
            p2.remove_box({"instance_id": iid})
        m2.destroy("t1", "known")
        _wait(lambda: not [i for i in (other, unmarked) if pod_of(fake_apiserver, i)], 15, "the cleanup")
        m2.shutdown()
    finally:
        store.close()
