"""The kubernetes provider when the API server refuses or misses a call (review 41's findings).

Every pod runs as a real container of the in-test API server; faults are its 403s per verb and
resource, and edits of its state (an expiry passed, a ConfigMap deleted, a pod held Pending).
"""

from __future__ import annotations

import re
import threading
import time

import pytest

from execbox.boxes import k8s_spec as ks
from execbox.errors import InstanceCreationError, InvalidConfigError, ProviderUnavailableError

from .conftest import pod_of
from .test_provider_fake import NS, _mine, _wait

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _claimed(fake, inst):
    return (pod_of(fake, inst) or {}).get("metadata", {}).get("labels", {}).get(ks.L_STATE) == ks.CLAIMED


def _session(p, fake, sid="s"):
    inst = p.create_instance(tenant_id="t", session_id=sid).instance_id
    _wait(lambda: _claimed(fake, inst), 10, "the claim")
    return inst, pod_of(fake, inst)["metadata"]["name"]


# -- finding 1: a destroy whose delete fails -------------------------------------------------
def test_refused_delete_is_retried_marked_ended_and_loses_its_egress(k8s_provider_factory, fake_apiserver):
    p, fake = k8s_provider_factory(), fake_apiserver
    inst, name = _session(p, fake)
    p.start_process(inst, "sleep 1000")
    fake.forbidden.add(("delete", "pods"))
    assert p.destroy_instance(inst)  # the session is gone for its caller; the pod is queued
    _wait(lambda: (fake.pod(name) or {}).get("metadata", {}).get("labels", {}).get(ks.L_STATE) == ks.ENDED, 10,
          "the ended mark")
    assert p.egress_lookup(name) is None
    time.sleep(1.5)  # sweeps while the API still refuses: the pod stays queued
    assert fake.pod(name) is not None and p.egress_lookup(name) is None
    fake.forbidden.clear()
    _wait(lambda: fake.pod(name) is None, 10, "the retried delete")


def test_delete_missed_during_an_outage_goes_once_the_api_is_back(k8s_provider_factory, fake_apiserver):
    p, fake = k8s_provider_factory(), fake_apiserver
    inst, name = _session(p, fake, "outage")
    fake.forbidden.update({("delete", "pods"), ("patch", "pods"), ("list", "pods")})  # nothing goes through
    assert p.destroy_instance(inst)
    time.sleep(1.5)
    assert fake.pod(name)["metadata"]["labels"][ks.L_STATE] == ks.CLAIMED  # not even the mark landed
    fake.forbidden.clear()
    _wait(lambda: fake.pod(name) is None, 10, "the delete after the outage")


def test_shutdown_retries_a_failed_delete(k8s_provider_factory, fake_apiserver):
    p, fake = k8s_provider_factory(sweep_interval=3600), fake_apiserver
    inst, name = _session(p, fake, "shut")
    fake.forbidden.update({("delete", "pods"), ("patch", "pods")})
    assert p.destroy_instance(inst)
    time.sleep(0.5)
    fake.forbidden.clear()
    p.shutdown()
    assert fake.pod(name) is None


def test_another_replica_sweeps_a_pod_marked_ended(k8s_provider_factory, fake_apiserver):
    a, fake = k8s_provider_factory(), fake_apiserver
    inst, name = _session(a, fake, "crash")
    fake.forbidden.add(("delete", "pods"))
    assert a.destroy_instance(inst)
    _wait(lambda: fake.pod(name)["metadata"]["labels"][ks.L_STATE] == ks.ENDED, 10, "the ended mark")
    a._stop.set()  # replica a "crashes": its queue is lost
    a._undeleted.clear()
    fake.forbidden.clear()
    b = k8s_provider_factory()
    _wait(lambda: fake.pod(name) is None, 10, "replica b's sweep")
    assert b.egress_lookup(name) is None


# -- finding 3: a failed claim -------------------------------------------------------------
def test_cold_start_whose_claim_is_refused_is_sb009_and_leaves_nothing(k8s_provider_factory, fake_apiserver):
    p, fake = k8s_provider_factory(), fake_apiserver
    fake.forbidden.add(("patch", "pods"))
    with pytest.raises(ProviderUnavailableError, match="could not claim the new pod; nothing was created"):
        p.create_instance(tenant_id="t", session_id="cold")
    assert not p.list_instances()
    _wait(lambda: not _mine(fake, p), 10, "the unclaimed pod's deletion")


def test_refused_pooled_claim_is_retried_and_the_pod_never_swept(k8s_provider_factory, fake_apiserver):
    p, fake = k8s_provider_factory(pool_size=1, warm_ttl=60), fake_apiserver
    _wait(lambda: p.pool_status()["ready"] == 1, 60, "the warm pod")
    fake.forbidden.add(("patch", "pods"))
    inst = p.create_instance(tenant_id="t", session_id="pooled").instance_id
    name = p._instances[inst].box.name
    time.sleep(0.5)
    pod = fake.pod(name)
    assert pod["metadata"]["labels"][ks.L_STATE] == ks.WARM
    pod["metadata"]["annotations"][ks.A_EXPIRES] = str(int(time.time()) - 1)  # its warm TTL has passed
    time.sleep(2.5)  # several sweeps
    assert fake.pod(name) is not None
    assert p.execute_code(inst, "print(7 * 6)", "python").stdout == "42\n"
    fake.forbidden.clear()
    _wait(lambda: _claimed(fake, inst), 10, "the retried claim")
    assert fake.pod(name)["metadata"]["annotations"][ks.A_INSTANCE] == inst
    q = k8s_provider_factory()  # another replica finds the session by its claim
    assert q.execute_code(inst, "print(1)", "python").stdout == "1\n"


# -- finding 4: long template names ------------------------------------------------------------
def test_long_template_names_keep_each_pods_uuid(k8s_provider_factory, fake_apiserver):
    p, fake = k8s_provider_factory(template="a" * 54), fake_apiserver
    names = {p._instances[p.create_instance(tenant_id="t", session_id=s).instance_id].box.name for s in "xy"}
    assert len(names) == 2
    for n in names:
        assert DNS_SUBDOMAIN.fullmatch(n) and len(n) <= 253, n
        assert len(fake.pod(n)["metadata"]["labels"][ks.L_TEMPLATE]) <= 63


@pytest.mark.parametrize("config", [{"template": "a" * 64}, {"template": "a" * 60, "templates": {"gpu": {}}},
                                    {"template": "abc-"}])
def test_template_names_that_cannot_label_pods_are_sb002(config, fake_apiserver):
    from execbox.providers.kubernetes import KubernetesProvider

    from .conftest import provider_config

    with pytest.raises(InvalidConfigError) as e:
        KubernetesProvider().initialize(provider_config(fake_apiserver, **config))
    assert e.value.code == "SB002" and "template" in e.value.message


# -- finding 5: the agent ConfigMap ------------------------------------------------------------
def test_deleted_configmap_is_recreated_by_the_sweeper(k8s_provider_factory, fake_apiserver):
    p, fake = k8s_provider_factory(), fake_apiserver
    fake.configmaps.clear()
    _wait(lambda: (NS, p.configmap) in fake.configmaps, 10, "the re-created ConfigMap")
    inst = p.create_instance(tenant_id="t", session_id="cm").instance_id
    assert p.execute_code(inst, "print(3)", "python").stdout == "3\n"


def test_pod_pending_on_a_missing_configmap_says_so(k8s_provider_factory, fake_apiserver):
    p, fake = k8s_provider_factory(ready_timeout=5, sweep_interval=3600), fake_apiserver
    fake.configmaps.clear()
    with pytest.raises(InstanceCreationError) as e:
        p.create_instance(tenant_id="t", session_id="cm1")
    assert "FailedMount" in e.value.message and "ConfigMap was missing (now re-created)" in e.value.message
    inst = p.create_instance(tenant_id="t", session_id="cm2").instance_id
    assert p.execute_code(inst, "print(4)", "python").stdout == "4\n"


# -- finding 9: NetworkPolicies -------------------------------------------------------------
def test_missing_or_unreadable_network_policies_are_warned_about(k8s_provider_factory, fake_apiserver):
    fake = fake_apiserver
    assert any("no NetworkPolicy" in w and "egress" in w for w in k8s_provider_factory().warnings())
    fake.network_policies[NS] = [
        {"metadata": {"name": "default-deny"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}]
    assert not [w for w in k8s_provider_factory().warnings() if "NetworkPolic" in w]
    fake.forbidden.add(("list", "networkpolicies"))
    assert any("could not check the NetworkPolicies" in w for w in k8s_provider_factory().warnings())


# -- finding 6: replicas with different ready timeouts ------------------------------------------
def test_a_replica_honours_anothers_ready_by(k8s_provider_factory, fake_apiserver):
    fake = fake_apiserver
    a = k8s_provider_factory(ready_timeout=60, sweep_interval=3600)
    k8s_provider_factory(ready_timeout=5)  # sweeps every 0.5 s: its own rule would call a pod stuck at 10 s
    fake.hold_pending = True
    out: list[BaseException] = []

    def create():
        try:
            a.create_instance(tenant_id="t", session_id="pend")
        except BaseException as e:  # noqa: BLE001
            out.append(e)

    t = threading.Thread(target=create)
    t.start()
    _wait(lambda: _mine(fake, a), 10, "a's pod")
    name = _mine(fake, a)[0]
    time.sleep(12)
    assert fake.pod(name) is not None, "replica b deleted a's starting pod before a's ready_timeout"
    fake.delete_pod(NS, name)
    t.join(10)
    assert out and "deleted before it became ready" in str(out[0])
