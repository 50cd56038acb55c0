"""A destroyed instance stays destroyed: no replica adopts it back from its pod.

``destroy_instance`` deletes a local instance's pod in the background (the reaper), so the pod is
still there, and Ready, when the call returns. Adoption (stateless gateways, hand-over) finds pods
by instance id: it must refuse one whose instance this replica destroyed (remembered), one labelled
``ended`` (``destroy_instance`` marks it before returning, for the other replicas) and one being
deleted (``deletionTimestamp``). The window is held open deterministically: the reaper's workers
are kept busy, or the fake API server holds the delete, and the sweepers do not run.

The pods are real containers of the in-test API server (tests/integration/kubernetes/conftest.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from execbox.boxes import k8s_spec as ks
from execbox.errors import SessionNotFoundError

from .conftest import pod_of

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]
QUIET = {"sweep_interval": 3600}  # no sweep deletes an ended pod under the test


@contextlib.contextmanager
def reaper_held(provider) -> Iterator[None]:
    """The provider's background jobs (its pods' deletes) wait until the block ends."""
    gate = threading.Event()
    busy = [threading.Event() for _ in range(provider._reaper._max_workers)]
    for started in busy:
        provider._reaper.submit(lambda s=started: (s.set(), gate.wait(120)))
    assert all(s.wait(10) for s in busy), "the reaper's workers did not all start the blocking job"
    try:
        yield
    finally:
        gate.set()


def _ready(pod) -> bool:
    conds = (pod or {}).get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def _refused(provider, iid: str) -> SessionNotFoundError:
    with pytest.raises(SessionNotFoundError) as e:
        r = provider.execute_code(iid, "print(1)", "python", 20, None)
        pytest.fail(f"a run on destroyed instance {iid} succeeded: {r.stdout!r}")
    assert e.value.http_status == 404
    return e.value


def _session(provider, fake) -> tuple[str, str]:
    """A session instance that has run once; (its id, its pod)."""
    iid = provider.create_instance(tenant_id="t1", session_id="s").instance_id
    r = provider.execute_code(iid, "x = 1\nprint(x)", "python", 20, context_id="c")
    assert r.exit_code == 0 and r.stdout == "1\n", r
    return iid, pod_of(fake, iid)["metadata"]["name"]


@pytest.fixture
def make(k8s_provider_factory):
    return lambda **config: k8s_provider_factory(**{**QUIET, **config})


def test_a_run_right_after_destroy_is_refused_while_the_pod_is_still_ready(make, fake_apiserver) -> None:
    p = make()
    for _ in range(3):  # the window is held open every time: not a matter of timing
        iid, pod = _session(p, fake_apiserver)
        with reaper_held(p):
            assert p.destroy_instance(iid)
            body = fake_apiserver.pod(pod)
            assert body is not None and _ready(body), "the pod's delete should still wait in the reaper"
            _refused(p, iid)
            assert body["metadata"]["labels"][ks.L_STATE] == ks.ENDED  # marked before destroy returned
            assert not p.instance_alive(iid)
            assert iid not in p._instances
        deadline = time.monotonic() + 15
        while fake_apiserver.pod(pod) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fake_apiserver.pod(pod) is None, "the queued delete ran once the reaper was free"
        _refused(p, iid)  # and later on: the pod gone, still 404


def test_another_replica_refuses_a_pod_destroyed_elsewhere(make, fake_apiserver) -> None:
    p1, p2 = make(), make()
    iid, pod = _session(p1, fake_apiserver)
    with reaper_held(p1):
        assert p1.destroy_instance(iid)
        assert _ready(fake_apiserver.pod(pod))  # its delete still waits: only the `ended` mark says so
        err = _refused(p2, iid)
        assert "ended" in err.message, err.message
        assert iid not in p2._instances
        handle = {"instance_id": iid, "box_id": pod}
        assert p2.adopt_instance(handle, tenant_id="t1", session_id="s") is None  # a restart's re-attach too


def test_a_pod_being_deleted_is_not_adopted(make, fake_apiserver) -> None:
    """Another replica's delete was accepted (``deletionTimestamp``) but the pod still runs, Ready,
    and its ``ended`` mark did not land (the API refused the patch)."""
    p1, p2 = make(), make()
    iid, pod = _session(p1, fake_apiserver)
    fake_apiserver.hold_deletes = True
    fake_apiserver.forbidden.add(("patch", "pods"))
    try:
        assert p1.destroy_instance(iid)
        deadline = time.monotonic() + 15
        while not fake_apiserver.pod(pod)["metadata"].get("deletionTimestamp"):
            assert time.monotonic() < deadline, "the background delete did not reach the API"
            time.sleep(0.1)
        body = fake_apiserver.pod(pod)
        assert _ready(body) and body["metadata"]["labels"][ks.L_STATE] == ks.CLAIMED
        err = _refused(p2, iid)
        assert "being deleted" in err.message, err.message
        assert p2.adopt_instance({"instance_id": iid, "box_id": pod}, tenant_id="t1", session_id="s") is None
    finally:
        fake_apiserver.forbidden.clear()
        fake_apiserver.release_deletes()


def test_a_restarted_replica_still_reattaches_a_live_session_pod(make, fake_apiserver) -> None:
    """The refusals leave adoption alone where nothing was destroyed: another replica (or this one
    restarted) re-attaches the live session's pod with its interpreter state."""
    p1, p2 = make(), make()
    iid, pod = _session(p1, fake_apiserver)
    other, _ = _session(p1, fake_apiserver)
    assert p1.destroy_instance(other)  # another instance destroyed: no effect on this one
    assert p2.adopt_instance({"instance_id": iid, "box_id": pod}, tenant_id="t1", session_id="s") is not None
    r = p2.execute_code(iid, "print(x + 1)", "python", 20, context_id="c")
    assert r.stdout == "2\n", r
    assert p2.destroy_instance(iid)
    _refused(p2, iid)
