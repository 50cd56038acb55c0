"""The kubernetes backend's egress grants name the pod's own IPs, so the proxy can refuse a pod's
credentials used from another address (another pod that read its env).

No cluster and no Docker: pods are the client objects' shapes (SimpleNamespace), the API a stub.
The end-to-end case (pods of the fake API server using each other's tokens) is in
tests/integration/kubernetes/test_egress.py.
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace as NS

from execbox.boxes import k8s_spec as ks
from execbox.boxes.k8s_box import pod_addresses
from execbox.egress.policy import parse_policy
from execbox.egress.proxy import Grant
from execbox.providers.agent_backed import Instance
from execbox.providers.kubernetes import KubernetesProvider

POLICY = parse_policy("allowlist", ["example.com"])


def pod(name="pod-a", ip="10.1.2.3", ips=None, state=ks.CLAIMED):
    labels = {**ks.MANAGED, ks.L_TEMPLATE: "python", ks.L_STATE: state, ks.L_EGRESS: "on"}
    ann = {ks.A_EGRESS: json.dumps({"network": "allowlist", "allow": ["example.com"]}), ks.A_TENANT: "t1",
           ks.A_SESSION: "s1", ks.A_INSTANCE: "i1"}
    return NS(metadata=NS(name=name, namespace="ns", labels=labels, annotations=ann, deletion_timestamp=None),
              status=NS(phase="Running", pod_ip=ip, pod_ips=[NS(ip=x) for x in ips] if ips is not None else None))


class Api:
    def __init__(self, pods):
        self.pods = {p.metadata.name: p for p in pods}
        self.patched: list[tuple[str, dict]] = []

    def get_pod(self, name):
        return self.pods.get(name)

    def patch_pod(self, name, body):
        self.patched.append((name, body))


def provider(api):
    p = object.__new__(KubernetesProvider)  # only what the egress lookup reads
    p.config = {"namespace": "ns"}
    p.templates = {"python": NS(name="python")}
    p.egress_cap = parse_policy("allowlist", ["example.com", "other.example"])
    p.api = api
    p._egress_cache = {}
    p._egress_locks = [threading.Lock() for _ in range(4)]
    return p


def test_pod_addresses():
    assert pod_addresses(pod(ip="10.1.2.3")) == ("10.1.2.3",)
    assert pod_addresses(pod(ip="fd00::5", ips=["fd00::5", "10.1.2.3"])) == ("fd00::5", "10.1.2.3")
    assert pod_addresses(pod(ip=None)) == ()
    assert pod_addresses(NS(status=None)) == ()


def test_the_grant_names_the_pod_s_ips_and_the_proxy_checks_them():
    p = provider(Api([pod(ip="10.1.2.3"), pod("pod-b", ip="10.1.2.4"),
                      pod("pod-dual", ip="fd00::5", ips=["fd00::5", "10.1.2.5"])]))
    g = p.egress_lookup("pod-a")
    assert isinstance(g, Grant) and g.addresses == ("10.1.2.3",) and g.tenant_id == "t1"
    assert g.policy.to_dict() == POLICY.to_dict()
    assert g.admits("10.1.2.3") and g.admits("::ffff:10.1.2.3")
    assert not g.admits("10.1.2.4") and not g.admits("?")  # pod-b holding pod-a's token
    dual = p.egress_lookup("pod-dual")
    assert dual is not None and dual.admits("10.1.2.5") and dual.admits("fd00::5") and not dual.admits("10.1.2.3")


def test_a_pod_without_an_ip_gets_no_grant():
    assert provider(Api([pod(ip=None)])).egress_lookup("pod-a") is None


def test_the_grant_cached_at_claim_names_the_box_s_addresses():
    """What this replica caches when it stores a policy on the pod (at claim, on a narrowing) carries
    the pod's IPs too: the cache never holds a grant the proxy would not check."""
    api = Api([])
    p = provider(api)
    box = NS(name="pod-a", pod_ip="fd00::5", addresses=("fd00::5", "10.1.2.5"))
    inst = Instance("i1", box, "t1", "s1", egress=POLICY)  # type: ignore[arg-type]
    p.patch_with_egress(inst, {})
    assert api.patched and api.patched[0][0] == "pod-a"
    g = p.egress_lookup("pod-a")  # from the cache: the stub API has no such pod
    assert g is not None and g.addresses == ("fd00::5", "10.1.2.5") and g.admits("10.1.2.5")
    assert not g.admits("10.1.2.6")
    # a box that does not know its addresses: nothing cached, the proxy reads the pod
    p.patch_with_egress(Instance("i2", NS(name="pod-x"), "t1", "s1", egress=POLICY), {})  # type: ignore[arg-type]
    assert "pod-x" not in p._egress_cache and p.egress_lookup("pod-x") is None


def test_grant_addresses_none_is_not_checked():
    g = Grant(POLICY)
    assert g.addresses is None and g.admits("203.0.113.9") and g.admits("?")
    assert Grant(POLICY, addresses="10.0.0.1").addresses == ("10.0.0.1",)  # type: ignore[arg-type]
    assert not Grant(POLICY, addresses=()).admits("10.0.0.1")
