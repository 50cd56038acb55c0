"""Opt-in: the provider against a real cluster (kind, k3s, a cloud). Runs only when KUBECONFIG is set.

The cluster must be able to pull EXECBOX_K8S_IMAGE (default execbox/python:latest: on kind,
`kind load docker-image`; on k3s, `docker save | k3s ctr images import -`), and this machine must
reach pod IPs (true on a k3s node; see docs/kubernetes.md for kind). The namespace
(EXECBOX_K8S_NAMESPACE, default execbox-sandboxes) must exist. Everything created is deleted.
"""

from __future__ import annotations

import os
import time

import pytest

from execbox.boxes import k8s_spec as ks

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="opt-in: set KUBECONFIG to a test cluster")]


@pytest.fixture
def real_provider():
    pytest.importorskip("kubernetes")
    from execbox.providers.kubernetes import KubernetesProvider

    p = KubernetesProvider()
    p.initialize({"kubeconfig": os.environ["KUBECONFIG"], "pool_size": 1, "ready_timeout": 300,
                  "namespace": os.environ.get("EXECBOX_K8S_NAMESPACE", "execbox-sandboxes"),
                  "image": os.environ.get("EXECBOX_K8S_IMAGE", "execbox/python:latest"),
                  "runtime_class": os.environ.get("EXECBOX_K8S_RUNTIME_CLASS", ""),
                  "agent_secret": "real-cluster-test-0123456789abcdef", "preload": "none"})
    yield p
    p.shutdown()
    deadline = time.monotonic() + 60
    while p.api is not None and time.monotonic() < deadline:
        left = [x for x in p.api.list_pods(f"{ks.L_TEMPLATE}=default")
                if (x.metadata.annotations or {}).get(ks.A_OWNER) == p.owner]
        if not left:
            return
        time.sleep(1)
    pytest.fail("pods of this test were left on the cluster")


def test_real_cluster_runs_sessions_and_cleans_up(real_provider):
    p = real_provider
    inst = p.create_instance(tenant_id="t1", session_id="s1").instance_id
    r = p.execute_code(inst, "import os\nprint(os.getuid())", "python")
    assert r.stdout == "1000\n", r
    p.write_file(inst, "a.txt", "x")
    assert p.read_file(inst, "a.txt").content.startswith("x")
    assert "Read-only file system" in p.run_command(inst, "touch /etc/x 2>&1; true").stdout
    one = p.create_instance(tenant_id="t1").instance_id
    assert p.execute_code(one, "print(2)", "python").stdout == "2\n"
    assert p.destroy_instance(one) and p.destroy_instance(inst)
