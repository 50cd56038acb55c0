"""The kubernetes provider against the in-test API server: every run executes in a real pod container."""

from __future__ import annotations

import json
import threading
import time

import pytest

from execbox.boxes import k8s_spec as ks
from execbox.errors import InstanceCreationError, OutOfMemoryError, ProviderUnavailableError
from tests.conftest import require

from .conftest import pod_of

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]
NS = "execbox-sandboxes"


def _wait(cond, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _mine(fake, provider):
    """Pod names this provider started (a session-shared provider may have pods in the fake too)."""
    return [n for n in fake.pod_names()
            if ((fake.pod(n) or {}).get("metadata", {}).get("annotations") or {}).get(ks.A_OWNER) == provider.owner]


def test_runs_files_pool_claim_and_delete(k8s_provider_factory, fake_apiserver):
    p, fake = k8s_provider_factory(pool_size=1), fake_apiserver
    _wait(lambda: p.pool_status()["ready"] == 1, 60, "the warm pod")
    inst = p.create_instance(tenant_id="t1", session_id="s1").instance_id
    r = p.execute_code(inst, "import os\ndef main(a):\n    print('uid', os.getuid())\n    return a * 2\n",
                       "python", arguments={"a": 21})
    assert r.exit_code == 0 and r.result == 42 and "uid 1000" in r.stdout, r
    assert p.execute_code(inst, "console.log(6 * 7)", "javascript").stdout.strip() == "42"
    p.write_file(inst, "data/x.txt", "hello")
    assert p.run_command(inst, "cat data/x.txt; touch /etc/x 2>&1 || true").stdout.startswith("hello")
    assert "Read-only file system" in p.run_command(inst, "touch /etc/x 2>&1; true").stdout
    # The claim is on the pod (labels for selection, annotations for the ids): replicas are stateless.
    _wait(lambda: (pod_of(fake, inst) or {}).get("metadata", {}).get("labels", {}).get(ks.L_STATE) == ks.CLAIMED,
          10, "the claim patch")
    pod = pod_of(fake, inst)
    assert pod["metadata"]["annotations"][ks.A_TENANT] == "t1"
    assert pod["metadata"]["labels"][ks.L_SESSION] == ks.label_value("s1")
    # The pool refilled in the background: a new warm pod besides the claimed one.
    _wait(lambda: p.pool_status()["ready"] == 1, 60, "the pool refill")
    warm = [n for n in _mine(fake, p) if fake.pod(n)["metadata"]["labels"][ks.L_STATE] == ks.WARM]
    assert len(warm) == 1 and warm[0] != pod["metadata"]["name"]
    assert p.destroy_instance(inst)
    _wait(lambda: pod_of(fake, inst) is None, 10, "the session's pod deletion")
    _wait(lambda: not any(c.name.endswith(pod["metadata"]["name"]) for c in fake.containers()), 20,
          "the pod's container removal")
    # Only lifecycle calls reach the API server: never exec/attach (the channel is the pod port).
    assert not [r for r in fake.requests if r[1].endswith(("/exec", "/attach", "/portforward"))]


def test_one_shot_gets_a_short_deadline(k8s_provider_factory, fake_apiserver):
    p = k8s_provider_factory(max_timeout=60)
    inst = p.create_instance(tenant_id="t1").instance_id
    pod = pod_of(fake_apiserver, inst)
    assert pod["spec"]["activeDeadlineSeconds"] <= 60 + 20 + 5  # max_timeout + 2 * grace + the pod's age
    assert p.execute_code(inst, "print('once')", "python").stdout == "once\n"


def test_user_namespaces_give_pods_their_own_host_uids_and_an_nproc_limit(k8s_provider_factory, fake_apiserver):
    """user_namespaces: hostUsers false, so RLIMIT_NPROC counts the pod's own user namespace and
    the agent applies pids_limit (under plain runc it would count uid 1000 node-wide: not set)."""
    for userns in (True, False):
        p = k8s_provider_factory(user_namespaces=userns, pids_limit=64)
        pod = pod_of(fake_apiserver, p.create_instance(tenant_id="t1").instance_id)
        command = pod["spec"]["containers"][0]["command"]
        limits = json.loads(command[command.index("--limits") + 1])
        assert pod["spec"].get("hostUsers", True) is not userns
        assert limits.get("nproc") == (64 if userns else None)


@pytest.mark.parametrize("how", ["Evicted", "deleted"])
def test_pod_dying_mid_run_is_a_clear_error_and_nothing_leaks(k8s_provider_factory, fake_apiserver, how):
    p = k8s_provider_factory()
    inst = p.create_instance(tenant_id="t1", session_id="s").instance_id
    name = pod_of(fake_apiserver, inst)["metadata"]["name"]
    if how == "Evicted":
        threading.Timer(1.0, fake_apiserver.end_pod, args=(name,), kwargs={"reason": "Evicted"}).start()
    else:  # someone (an operator, a node drain) deletes the pod
        threading.Timer(1.0, fake_apiserver.delete_pod, args=(NS, name)).start()
    with pytest.raises(ProviderUnavailableError) as e:
        p.execute_code(inst, "import time\ntime.sleep(30)", "python", timeout=40)
    expected = "Evicted" if how == "Evicted" else "pod deleted"
    assert e.value.code == "SB009" and expected in e.value.message, e.value.message
    _wait(lambda: name not in fake_apiserver.pod_names(), 10, "the evicted pod's deletion")
    with pytest.raises(ProviderUnavailableError):
        p.execute_code(inst, "print(1)", "python")


def test_oom_killed_pod_is_sb006(k8s_provider_factory, fake_apiserver):
    p = k8s_provider_factory()
    inst = p.create_instance(tenant_id="t1", session_id="s").instance_id
    name = pod_of(fake_apiserver, inst)["metadata"]["name"]
    threading.Timer(1.0, fake_apiserver.end_pod, args=(name,), kwargs={"reason": "OOMKilled"}).start()
    with pytest.raises(OutOfMemoryError) as e:
        p.execute_code(inst, "import time\ntime.sleep(30)", "python", timeout=40)
    assert e.value.code == "SB006" and "OOMKilled" in e.value.message


def test_memory_bomb_inside_the_pod_is_sb006_and_the_pod_survives(k8s_provider_factory):
    p = k8s_provider_factory()
    inst = p.create_instance(tenant_id="t1", session_id="s").instance_id
    r = p.execute_code(inst, "x = bytearray(1024 * 1024 * 1024)", "python")
    assert r.metadata.get("error_code") == "SB006", r
    assert p.execute_code(inst, "print('still here')", "python").stdout == "still here\n"


def test_fork_bomb_is_contained_by_the_node_pids_limit(k8s_provider_factory):
    p = k8s_provider_factory()
    inst = p.create_instance(tenant_id="t1", session_id="s").instance_id
    r = p.execute_code(inst, "for i in $(seq 1 200); do sleep 3 & done 2>&1; wait; echo done", "bash", timeout=20)
    assert "Resource temporarily unavailable" in r.stdout + r.stderr
    assert p.execute_code(inst, "print(1)", "python").stdout == "1\n"


def test_pool_self_heals_when_a_warm_pod_dies(k8s_provider_factory, fake_apiserver):
    p = k8s_provider_factory(pool_size=1, pool_wait=60)
    _wait(lambda: p.pool_status()["ready"] == 1, 60, "the warm pod")
    (first,) = _mine(fake_apiserver, p)
    fake_apiserver.end_pod(first, reason="Evicted")
    inst = p.create_instance(tenant_id="t1", session_id="s").instance_id
    assert p.execute_code(inst, "print('ok')", "python").stdout == "ok\n"
    # A pooled pod is claimed in the background: wait for the patch before reading the pod by its claim.
    _wait(lambda: pod_of(fake_apiserver, inst) is not None, 10, "the claim patch")
    assert pod_of(fake_apiserver, inst)["metadata"]["name"] != first
    _wait(lambda: first not in fake_apiserver.pod_names(), 10, "the dead warm pod's removal")


def test_another_replica_takes_over_a_session(k8s_provider_factory, fake_apiserver):
    a, b = k8s_provider_factory(), k8s_provider_factory()
    inst = a.create_instance(tenant_id="t1", session_id="s").instance_id
    a.execute_code(inst, "counter = 41", "python", context_id="c1")
    a.write_file(inst, "note.txt", "from a")
    _wait(lambda: (pod_of(fake_apiserver, inst) or {}).get("metadata", {}).get("labels", {}).get(ks.L_STATE)
          == ks.CLAIMED, 10, "the claim")
    r = b.execute_code(inst, "print(counter + 1)", "python", context_id="c1")
    assert r.stdout == "42\n", r
    assert b.read_file(inst, "note.txt").content.startswith("from a")
    assert b.destroy_instance(inst)
    _wait(lambda: pod_of(fake_apiserver, inst) is None, 10, "the pod deletion")


def test_wrong_secret_cannot_take_over(k8s_provider_factory, fake_apiserver):
    a = k8s_provider_factory()
    intruder = k8s_provider_factory(agent_secret="another-secret-0123456789abcdef")
    inst = a.create_instance(tenant_id="t1", session_id="s").instance_id
    _wait(lambda: pod_of(fake_apiserver, inst) is not None, 10, "the claim")
    with pytest.raises(InstanceCreationError) as e:
        intruder.execute_code(inst, "print(1)", "python")
    assert "handshake failed" in e.value.message
    assert a.execute_code(inst, "print('mine')", "python").stdout == "mine\n"


@pytest.mark.parametrize("pool_size", [0, 1])
def test_image_pull_failure_is_sb004_and_the_pod_is_deleted(k8s_provider_factory, fake_apiserver, pool_size):
    p = k8s_provider_factory(image="execbox/does-not-exist:1", pool_size=pool_size, pool_wait=60)
    started = time.monotonic()
    with pytest.raises(InstanceCreationError) as e:
        p.create_instance(tenant_id="t1")
    assert e.value.code == "SB004" and "ErrImagePull" in e.value.message
    assert time.monotonic() - started < 30  # a failing pool is not waited on for pool_wait
    if pool_size:
        assert not p.pool_status()["healthy"] and "ErrImagePull" in p.pool_status()["last_error"]
    p.shutdown()
    _wait(lambda: _mine(fake_apiserver, p) == [], 10, "no pods left")


def test_pod_that_never_becomes_ready_is_sb004_and_deleted(k8s_provider_factory, fake_apiserver):
    p = k8s_provider_factory(ready_timeout=5)
    fake_apiserver.hold_pending = True
    with pytest.raises(InstanceCreationError) as e:
        p.create_instance(tenant_id="t1")
    assert "did not become ready within 5s" in e.value.message and "Unschedulable" in e.value.message
    assert _mine(fake_apiserver, p) == []


def test_rbac_refusal_is_sb009_naming_the_role(k8s_provider_factory, fake_apiserver, caplog):
    """The tenant's message names the operation and RBAC; the log also names the namespace and the Role."""
    p = k8s_provider_factory()
    fake_apiserver.forbidden.add(("create", "pods"))
    with pytest.raises(ProviderUnavailableError) as e:
        p.create_instance(tenant_id="t1")
    assert e.value.code == "SB009" and "refused to create pods" in e.value.message and "RBAC" in e.value.message
    assert NS not in e.value.message and "serviceaccount" not in e.value.message
    assert "rbac.yaml" in caplog.text and "system:serviceaccount:execbox:gateway" in caplog.text
    fake_apiserver.forbidden.add(("create", "configmaps"))
    fake_apiserver.configmaps.clear()
    with pytest.raises(ProviderUnavailableError, match="refused to create configmaps"):
        k8s_provider_factory()


def test_api_timeout_is_sb009_and_pool_recovers(k8s_provider_factory, fake_apiserver):
    p = k8s_provider_factory(api_timeout=1, pool_size=1, pool_wait=0)
    fake_apiserver.delay = 2.0
    with pytest.raises(ProviderUnavailableError) as e:
        p.create_instance(tenant_id="t1")
    assert "too slow" in e.value.message
    _wait(lambda: not p.pool_status()["healthy"], 20, "the pool to record the failure")
    fake_apiserver.delay = 0.0
    _wait(lambda: p.pool_status()["ready"] == 1, 60, "the pool to heal")


def test_sweeper_removes_ended_and_expired_pods_of_any_replica(k8s_provider_factory, fake_apiserver):
    p = k8s_provider_factory(sweep_interval=3600)
    p.failed_grace = 0.0
    orphan = p.pod_manifest("execbox-default-orphan0001", annotations={ks.A_EXPIRES: str(int(time.time()) - 1)})
    fake_apiserver.create_pod(NS, orphan)
    ended = p.pod_manifest("execbox-default-ended00001")
    fake_apiserver.create_pod(NS, ended)
    _wait(lambda: (fake_apiserver.pod("execbox-default-ended00001") or {}).get("status", {}).get("phase")
          == "Running", 30, "the pod to run")
    fake_apiserver.end_pod("execbox-default-ended00001", reason="OOMKilled")
    _wait(lambda: fake_apiserver.pod("execbox-default-ended00001")["status"]["phase"] == "Failed", 10, "the end")
    live = p.create_instance(tenant_id="t1", session_id="s").instance_id
    p.sweep()  # another replica's sweeper (a session-shared provider) may take the expired one first
    assert _mine(fake_apiserver, p) == [pod_of(fake_apiserver, live)["metadata"]["name"]]


def test_every_pod_the_provider_created_is_schema_valid_and_hardened(k8s_provider_factory, fake_apiserver):
    """What reached the API server (not just the builder's output) passes the offline checks."""
    from tests.integration.kubernetes.test_manifests import assert_hardened_pod_spec, kv, validate

    p = k8s_provider_factory(runtime_class="", node_selector={"kubernetes.io/os": "linux"},
                             tolerations=[{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}])
    inst = p.create_instance(tenant_id="t1").instance_id
    assert p.execute_code(inst, "print(1)", "python").stdout == "1\n"
    name = pod_of(fake_apiserver, inst)["metadata"]["name"]
    (body,) = [b for b in fake_apiserver.created if b["metadata"]["name"] == name]
    require(kv is not None, "kubernetes-validate (pip install -e '.[dev]')")
    validate(body)
    assert_hardened_pod_spec(body["spec"], box=True)
    assert body["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}


def test_shared_fixture_provider_runs(kubernetes_provider):
    """The session-wide fixture other suites use (tests/conformance/) is a working provider."""
    inst = kubernetes_provider.create_instance(tenant_id="t1", session_id="shared").instance_id
    try:
        assert kubernetes_provider.execute_code(inst, "print(6 * 7)", "python").stdout == "42\n"
    finally:
        kubernetes_provider.destroy_instance(inst)


def test_named_templates_have_their_own_pod_spec_and_warm_pool(k8s_provider_factory, fake_apiserver):
    p = k8s_provider_factory(templates={"small": {"memory": "128Mi", "pool_size": 1}})
    _wait(lambda: p.pool_status()["templates"]["small"]["ready"] == 1, 60, "the small template's warm pod")
    small = p.create_instance("small", tenant_id="t1", session_id="a").instance_id
    other = p.create_instance("python", tenant_id="t1", session_id="b").instance_id  # unknown: the top level
    pod_small, pod_other = pod_of(fake_apiserver, small), pod_of(fake_apiserver, other)
    assert pod_small["metadata"]["labels"][ks.L_TEMPLATE] == "default-small"
    assert pod_small["spec"]["containers"][0]["resources"]["limits"]["memory"] == "128Mi"
    assert pod_other["metadata"]["labels"][ks.L_TEMPLATE] == "default"
    assert pod_other["spec"]["containers"][0]["resources"]["limits"]["memory"] == "256Mi"
    assert p.execute_code(small, "print('s')", "python").stdout == "s\n"
    _wait(lambda: p.pool_status()["templates"]["small"]["ready"] == 1, 60, "the small pool's refill")


def test_bad_template_config_is_sb002(k8s_provider_factory):
    from execbox.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="templates.x: unknown keys"):
        k8s_provider_factory(templates={"x": {"hostNetwork": True}})
    with pytest.raises(InvalidConfigError, match="not a Kubernetes quantity"):
        k8s_provider_factory(templates={"x": {"memory": "lots"}})


def test_gvisor_pods_below_512mi_preload_nothing_and_say_why(k8s_provider_factory):
    """As docker's runsc boxes (providers/preload.py): gVisor counts the preloaded agent's heap."""
    p = k8s_provider_factory(runtime_class="gvisor", memory="256Mi", pool_size=0, preload="auto",
                             templates={"big": {"memory": "1Gi"}, "named": {"preload": "auto,torch"}})
    assert p.templates["default"].preload == "none" and p.templates["big"].preload == "auto"
    assert p.templates["named"].preload == "torch"
    notes = {w.split(":")[0]: w for w in p.warnings() if "preload" in w}
    assert set(notes) == {f"template {p.templates[t].name}" for t in ("default", "named")}
    assert all("gvisor" in n and "512 MiB" in n for n in notes.values())
    assert "boxes preload 'none'" in notes[f"template {p.templates['default'].name}"]
    assert "boxes preload 'torch'" in notes[f"template {p.templates['named'].name}"]
    runc = k8s_provider_factory(runtime_class="", memory="256Mi", pool_size=0, preload="auto")
    assert runc.templates["default"].preload == "auto" and not [w for w in runc.warnings() if "preload" in w]
