"""Kubernetes sessions across restarts when the API or a pod misbehaves (review 44): an API that
does not answer at a restart's re-adoption keeps the row's pod for the session's next use (it
leaked, still claimed); a row write that fails after a pod started takes the pod along (it was
marked, no row named it, and another replica's orphan removal deleted it under the live session);
orphans are looked for by the periodic sweep too, not only at start; a pod whose agent is slow to
answer at re-adoption is kept; the failed-delete queue is bounded and reported; without a shared
agent_secret the provider says that sessions do not survive a restart.

The pods are real containers of the in-test API server (tests/integration/kubernetes/conftest.py)."""

from __future__ import annotations

import time

import pytest

from execbox.errors import ProviderUnavailableError
from execbox.providers import kubernetes_sweep
from execbox.service.store import open_store

from .conftest import pod_of
from .test_handover import _box_id, _manager, _run, _session_pods, _wait

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]
NS = "execbox-sandboxes"


def _parked(k8s_provider_factory, fake, store, ws):
    """A session whose interpreter holds x = 41, its replica stopped gracefully (its pod left running)."""
    p1 = k8s_provider_factory()
    m1 = _manager(store, p1, "r1", ws)
    assert _run(m1, "x = 41")[0].exit_code == 0
    [pod] = _session_pods(fake, "s")
    m1.shutdown()
    p1.shutdown()
    assert _session_pods(fake, "s") == [pod]
    return pod


def _restarted_while_the_api_is_slow(k8s_provider_factory, fake, store, ws):
    """A parked session's replica started again while the API answers too slowly for its
    re-adoption (the fake's delay stays on: the caller turns it off); (the pod, the new manager)."""
    pod = _parked(k8s_provider_factory, fake, store, ws)
    m2 = _manager(store, k8s_provider_factory(api_timeout=1), "r1", ws)
    fake.delay = 2.0
    m2.start()
    return pod, m2


def test_an_api_outage_at_restart_keeps_the_pod_for_the_next_use(k8s_provider_factory, fake_apiserver,
                                                                  tmp_path) -> None:
    store = open_store(tmp_path / "data")
    ws = str(tmp_path / "ws")
    try:
        pod, m2 = _restarted_while_the_api_is_slow(k8s_provider_factory, fake_apiserver, store, ws)
        try:
            assert _box_id(store) == pod  # the row still names the pod
            with pytest.raises(ProviderUnavailableError):  # used while the API is still down: SB009
                _run(m2, "print(x)")
        finally:
            fake_apiserver.delay = 0.0
        assert _box_id(store) == pod
        r, s = _run(m2, "print(x + 1)")  # the API is back: the same pod, its interpreter state
        assert r.stdout == "42\n" and not s.contexts_lost, r
        assert _session_pods(fake_apiserver, "s") == [pod]
        m2.destroy("t1", "s")
        _wait(lambda: not _session_pods(fake_apiserver, "s"), 15, "the destroyed session's pod deletion")
        m2.shutdown()
    finally:
        fake_apiserver.delay = 0.0
        store.close()


def test_a_session_destroyed_before_its_pod_was_reattached_takes_it_along(k8s_provider_factory, fake_apiserver,
                                                                           tmp_path) -> None:
    store = open_store(tmp_path / "data")
    ws = str(tmp_path / "ws")
    try:
        pod, m2 = _restarted_while_the_api_is_slow(k8s_provider_factory, fake_apiserver, store, ws)
        fake_apiserver.delay = 0.0
        m2.destroy("t1", "s")  # never used since the restart: its pod goes by the row's handle
        _wait(lambda: pod not in fake_apiserver.pod_names(), 15, "the destroyed session's pod deletion")
        m2.shutdown()
    finally:
        fake_apiserver.delay = 0.0
        store.close()


def test_a_failed_row_write_takes_the_new_pod_along_and_orphan_removal_spares_live_ones(
        k8s_provider_factory, fake_apiserver, tmp_path) -> None:
    store = open_store(tmp_path / "data")
    ws = str(tmp_path / "ws")
    p1 = k8s_provider_factory()
    m1 = _manager(store, p1, "ra", ws)
    orig = store.sessions.update
    failed = []

    def flaky(*a, **kw):
        if "box_handle" in kw and kw.get("state") == "running" and not failed:
            failed.append(1)
            raise RuntimeError("database blip")
        return orig(*a, **kw)

    try:
        store.sessions.update = flaky
        with pytest.raises(RuntimeError):
            _run(m1, "x = 41")
        store.sessions.update = orig
        _wait(lambda: not _session_pods(fake_apiserver, "s"), 15, "the unrecorded pod's deletion")
        r, _ = _run(m1, "x = 41")  # a new pod, and the row names it
        assert r.exit_code == 0, r
        [pod] = _session_pods(fake_apiserver, "s")
        assert _box_id(store) == pod
        _wait(lambda: "execbox.dev/registry" in (fake_apiserver.pod(pod) or {}).get("metadata", {}).get(
            "annotations", {}), 15, "the registry mark")
        p2 = k8s_provider_factory()
        p2.orphan_grace = 0  # i.e. a replica starting long after
        m2 = _manager(store, p2, "rb", ws)
        assert p2.remove_orphans(m2._box_ids(), m2.workspaces_root) == 0
        assert _run(m1, "print(x)")[0].stdout == "41\n"
        m1.destroy("t1", "s")
        _wait(lambda: not _session_pods(fake_apiserver, "s"), 15, "the destroyed session's pod deletion")
    finally:
        store.sessions.update = orig
        m1.shutdown()
        store.close()


def test_the_periodic_sweep_removes_orphan_pods(k8s_provider_factory, fake_apiserver, tmp_path) -> None:
    store = open_store(tmp_path / "data")
    p1 = k8s_provider_factory()
    m1 = _manager(store, p1, "r1", str(tmp_path / "ws"))
    try:
        _run(m1, "x = 1", "known")
        known = _box_id(store, "known")
        _run(m1, "x = 0", "ghost")
        [ghost] = _session_pods(fake_apiserver, "ghost")
        _wait(lambda: "execbox.dev/registry" in (fake_apiserver.pod(ghost) or {}).get("metadata", {}).get(
            "annotations", {}), 15, "the registry mark")
        with p1._lock:  # the row goes and no local session holds the pod (a crash mid-creation)
            iid = next(i for i, inst in p1._instances.items() if inst.box.name == ghost)
        p1.detach_instance(iid)
        m1._sessions.pop(("t1", "ghost"))
        store.sessions.delete("t1", "ghost")
        p1.orphan_grace = 0  # its marking is past the grace now
        m1._sweep()  # the service's periodic sweep, no restart
        _wait(lambda: ghost not in fake_apiserver.pod_names(), 15, "the orphan's deletion")
        assert known in fake_apiserver.pod_names()
        m1.destroy("t1", "known")
        _wait(lambda: known not in fake_apiserver.pod_names(), 15, "the cleanup")
        m1.shutdown()
    finally:
        store.close()


def test_a_pod_slow_to_answer_at_restart_is_kept(k8s_provider_factory, fake_apiserver, tmp_path) -> None:
    store = open_store(tmp_path / "data")
    ws = str(tmp_path / "ws")
    container = None
    try:
        pod = _parked(k8s_provider_factory, fake_apiserver, store, ws)
        container = fake_apiserver.pods[(NS, pod)].container
        container.pause()  # Ready to the kubelet, its agent does not answer the handshake
        p2 = k8s_provider_factory()
        m2 = _manager(store, p2, "r1", ws)
        m2.start()
        assert pod in fake_apiserver.pod_names() and _box_id(store) == pod
        container.unpause()
        container = None
        _wait(lambda: {"type": "Ready", "status": "True"} in fake_apiserver.pod(pod)["status"]["conditions"], 15,
              "the pod Ready again")
        r, s = _run(m2, "print(x + 1)")
        assert r.stdout == "42\n" and not s.contexts_lost, r
        assert _session_pods(fake_apiserver, "s") == [pod]
        m2.destroy("t1", "s")
        _wait(lambda: not _session_pods(fake_apiserver, "s"), 15, "the destroyed session's pod deletion")
        m2.shutdown()
    finally:
        if container is not None:
            container.unpause()
        store.close()


def test_without_a_shared_agent_secret_the_provider_says_sessions_do_not_survive_a_restart(
        k8s_provider_factory, fake_apiserver, monkeypatch) -> None:
    monkeypatch.delenv("EXECBOX_K8S_AGENT_SECRET", raising=False)
    p = k8s_provider_factory(agent_secret="")
    assert any("do not survive a restart" in w for w in p.warnings()), p.warnings()
    assert not p.shared_secret
    assert k8s_provider_factory().shared_secret


def test_the_failed_delete_queue_is_bounded_and_reported(k8s_provider_factory, fake_apiserver, monkeypatch) -> None:
    monkeypatch.setattr(kubernetes_sweep, "UNDELETED_CAP", 2, raising=False)
    p = k8s_provider_factory(sweep_interval=3600)
    iids = [p.create_instance(tenant_id="t", session_id=f"s{i}").instance_id for i in range(3)]
    pods = [pod_of(fake_apiserver, i)["metadata"]["name"] for i in iids]
    fake_apiserver.forbidden.update({("delete", "pods"), ("patch", "pods")})
    for iid in iids:
        assert p.destroy_instance(iid)
    _wait(lambda: len(p._undeleted) == 2, 10, "the failed deletes")
    time.sleep(0.5)
    assert len(p._undeleted) == 2
    assert (p.pool_status() or {}).get("undeleted_pods") == 2
    assert any("queued" in w for w in p.warnings())
    fake_apiserver.forbidden.clear()
    assert p.retry_deletes() == []
    assert "undeleted_pods" not in (p.pool_status() or {})
    for name in pods:  # the one past the cap: here by hand (in production its deadline ends it)
        if name in fake_apiserver.pod_names():
            p.api.delete_pod(name)
