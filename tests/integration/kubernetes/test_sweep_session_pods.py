"""A replica's sweeper does not delete another replica's live session pod that is not Ready for a
while (review 46 F7): a pod marked with its session registry was Ready once, so a failing probe is a
hiccup or a death its owner, a take-over's re-attach or the session's end settles. A pod that was
never marked (never served a session) is still swept as stuck."""

from __future__ import annotations

import time

from .test_provider_fake import NS, _wait


def test_another_replicas_marked_session_pod_is_not_swept_while_not_ready(k8s_provider_factory, fake_apiserver):
    fake = fake_apiserver
    owner = k8s_provider_factory(ready_timeout=5, sweep_interval=3600)
    k8s_provider_factory(ready_timeout=5)  # another replica, sweeping every 0.5 s
    iid = owner.create_instance(tenant_id="t", session_id="live").instance_id
    assert owner.execute_code(iid, "open('state', 'w').write('41')", "python").exit_code == 0
    pod = owner._instances[iid].box.name
    owner.mark_box(iid, {"execbox.registry": "/srv/registry", "execbox.replica": "r1"})
    _wait(lambda: "execbox.dev/registry" in fake.pod(pod)["metadata"].get("annotations", {}), 10, "the mark")
    fake.not_ready.add(pod)  # its readiness probe fails for a while
    _wait(lambda: {"type": "Ready", "status": "False"} in fake.pod(pod)["status"]["conditions"], 10, "NotReady")
    time.sleep(12)  # past its ready-by time (creation + 5 s) plus the sweeper's ready_timeout (5 s)
    assert fake.pod(pod) is not None, "another replica swept a live session's pod that missed its probes"
    fake.not_ready.discard(pod)
    r = owner.execute_code(iid, "print(int(open('state').read()) + 1)", "python")  # the same pod
    assert r.stdout == "42\n", r
    owner.destroy_instance(iid)


def test_an_unmarked_pod_that_stays_not_ready_is_still_swept(k8s_provider_factory, fake_apiserver):
    fake = fake_apiserver
    owner = k8s_provider_factory(ready_timeout=5, sweep_interval=3600)
    k8s_provider_factory(ready_timeout=5)
    iid = owner.create_instance(tenant_id="t", session_id="unmarked").instance_id
    pod = owner._instances[iid].box.name
    owner._instances.pop(iid)  # as if its owner were gone without a registry to know it
    fake.not_ready.add(pod)
    _wait(lambda: fake.pod(pod) is None, 30, "the stuck unmarked pod swept")
    assert pod not in fake.pod_names(NS)
