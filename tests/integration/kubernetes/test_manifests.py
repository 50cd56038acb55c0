"""Offline checks of every manifest: kustomize output and generated pod specs, validated against the
pinned Kubernetes OpenAPI schemas (kubernetes-validate, strict: unknown fields fail) and the hardening
list of issue 18."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml

from execbox.boxes import k8s_spec as ks
from tests.conftest import require
from tests.integration.kubernetes.kustomize_lite import render

try:
    import kubernetes_validate as kv
except ImportError:  # pragma: no cover - a dev dependency
    kv = None

K8S_VERSION = "1.31.0"  # pinned: the oldest minor still in upstream support when this was written
ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "deploy", "kubernetes")
TARGETS = ["base", "overlays/gvisor", "overlays/external-postgres"]
GATEWAY_NS, SANDBOX_NS = "execbox", "execbox-sandboxes"


@pytest.fixture(autouse=True)
def _validator():
    require(kv is not None, "kubernetes-validate (pip install -e '.[dev]')")


def validate(doc):
    kv.validate(doc, K8S_VERSION, strict=True)


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind, name):
    (d,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return d


def assert_hardened_pod_spec(spec, *, box: bool):
    """The hardening list, on a PodSpec (a box pod, or the gateway's pod template)."""
    psc = spec.get("securityContext") or {}
    assert psc.get("runAsNonRoot") is True
    assert psc.get("seccompProfile") == {"type": "RuntimeDefault"}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(flag), flag
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc.get("privileged", False) is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert "limits" in c["resources"] and "memory" in c["resources"]["limits"]
    if box:
        assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
        assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] > 0
        vols = {v["name"]: v for v in spec["volumes"]}
        assert vols["workspace"]["emptyDir"]["sizeLimit"] and vols["tmp"]["emptyDir"]["sizeLimit"]
        assert all("hostPath" not in v for v in spec["volumes"])
        c = spec["containers"][0]
        assert c["securityContext"]["runAsUser"] != 0 and c["securityContext"]["seccompProfile"]["type"] == \
            "RuntimeDefault"


@pytest.mark.parametrize("target", TARGETS)
def test_kustomize_output_is_valid_and_hardened(target):
    docs = render(os.path.join(ROOT, target))
    for doc in docs:
        validate(doc)
    namespaces = {d["metadata"]["name"] for d in by_kind(docs, "Namespace")}
    assert {GATEWAY_NS, SANDBOX_NS} <= namespaces
    # Gateway: 2+ replicas, readiness on /readyz, PDB, hardened pod, in its own namespace.
    gw = one(docs, "Deployment", "execbox-gateway")
    assert gw["metadata"]["namespace"] == GATEWAY_NS and gw["spec"]["replicas"] >= 2
    pod = gw["spec"]["template"]["spec"]
    assert pod["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert_hardened_pod_spec(pod, box=False)
    pdb = one(docs, "PodDisruptionBudget", "execbox-gateway")
    assert pdb["spec"]["selector"]["matchLabels"] == gw["spec"]["selector"]["matchLabels"]
    assert one(docs, "Service", "execbox-gateway")["spec"]["selector"] == gw["spec"]["selector"]["matchLabels"]
    # RBAC: a namespaced Role in the sandbox namespace only, no wildcards, nothing cluster-wide.
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    (role,) = by_kind(docs, "Role")
    assert role["metadata"]["namespace"] == SANDBOX_NS
    allowed = {("", "pods"): {"create", "get", "list", "watch", "patch", "delete"},
               ("", "configmaps"): {"create", "get"}, ("", "events"): {"list"},  # events: read-only, reports
               ("networking.k8s.io", "networkpolicies"): {"list"}}  # the isolation check at start
    for rule in role["rules"]:
        (group,) = rule["apiGroups"]
        for res in rule["resources"]:
            assert (group, res) in allowed and set(rule["verbs"]) <= allowed[group, res], rule
    (binding,) = by_kind(docs, "RoleBinding")
    assert binding["metadata"]["namespace"] == SANDBOX_NS
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                    "namespace": GATEWAY_NS}]
    # Sandbox namespace: deny all both ways; the openings are the agent port from gateway pods and,
    # for pods labelled execbox.dev/egress=on only, the gateway's egress proxy port.
    nps = {d["metadata"]["name"]: d for d in by_kind(docs, "NetworkPolicy") if d["metadata"]["namespace"] == SANDBOX_NS}
    deny = nps.pop("default-deny")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    assert_egress_only_to_the_proxy(nps.pop("egress-proxy-only")["spec"], gw, docs)
    for np in nps.values():
        assert "Egress" not in np["spec"]["policyTypes"] and not np["spec"].get("egress")
        for rule in np["spec"]["ingress"]:
            assert rule["ports"] == [{"protocol": "TCP", "port": ks.AGENT_PORT}]
            for peer in rule["from"]:
                assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": GATEWAY_NS}
                assert peer["podSelector"]["matchLabels"] == gw["spec"]["selector"]["matchLabels"]
    seed = json.loads(one(docs, "ConfigMap", "execbox-gateway-config")["data"]["system_settings.json"])
    k8s_cfg = json.loads(next(s["value"] for s in seed["system_settings"] if s["name"] == "sandbox.kubernetes"))
    assert k8s_cfg["namespace"] == SANDBOX_NS
    from execbox.providers.kubernetes_egress import egress_problem

    host, port = k8s_cfg["egress_proxy"].rsplit(":", 1)
    svc = one(docs, "Service", "execbox-egress")
    assert host == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc" and int(port) == PROXY_PORT
    assert egress_problem({**k8s_cfg, "network": "allowlist", "network_allow": ["pypi.org"],
                           "egress_proxy_listen": "0.0.0.0:15080"}) is None
    if target == "overlays/gvisor":
        assert one(docs, "RuntimeClass", "gvisor")["handler"] == "runsc"
        assert k8s_cfg["runtime_class"] == "gvisor"
    if target == "overlays/external-postgres":
        assert not by_kind(docs, "StatefulSet") and not [d for d in docs if "postgres" in d["metadata"]["name"]]
    else:
        assert one(docs, "StatefulSet", "execbox-postgres")


PROXY_PORT = 15080


def assert_egress_only_to_the_proxy(spec, gw, docs):
    """The sandbox's one egress opening: labelled pods to the gateway pods' proxy port, nothing else;
    the gateway takes that port only from such pods, through a Service of its own; its upstream
    egress excludes private, loopback and link-local (metadata) ranges."""
    assert spec["podSelector"]["matchLabels"] == {**ks.MANAGED, ks.L_EGRESS: "on"}
    assert spec["policyTypes"] == ["Egress"] and "ingress" not in spec
    (rule,) = spec["egress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": PROXY_PORT}]
    (peer,) = rule["to"]
    assert set(peer) == {"namespaceSelector", "podSelector"}  # no ipBlock: never the internet directly
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": GATEWAY_NS}
    assert peer["podSelector"]["matchLabels"] == gw["spec"]["selector"]["matchLabels"]
    ports = {p["containerPort"]: p["name"] for p in gw["spec"]["template"]["spec"]["containers"][0]["ports"]}
    svc = one(docs, "Service", "execbox-egress")
    assert svc["spec"]["selector"] == gw["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"] == [{"name": "egress-proxy", "port": PROXY_PORT, "targetPort": ports[PROXY_PORT]}]
    assert all(p["port"] != PROXY_PORT for p in one(docs, "Service", "execbox-gateway")["spec"]["ports"])
    gw_nps = [d["spec"] for d in by_kind(docs, "NetworkPolicy") if d["metadata"]["namespace"] == GATEWAY_NS]
    proxy_in = [r for np in gw_nps for r in np.get("ingress") or []
                if any(p["port"] == PROXY_PORT for p in r.get("ports") or [])]
    boxes_with_egress = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": SANDBOX_NS}},
                         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "execbox-box", ks.L_EGRESS: "on"}}}
    assert proxy_in and all(r["from"] == [boxes_with_egress] for r in proxy_in)
    assert not [r for np in gw_nps for r in np.get("ingress") or [] if not r.get("ports")]  # no open-port rule
    blocks = [peer["ipBlock"] for np in gw_nps for r in np.get("egress") or [] for peer in r.get("to") or []
              if "ipBlock" in peer and peer["ipBlock"]["cidr"] == "0.0.0.0/0"]
    assert blocks and all({"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8"}
                          <= set(b["except"]) for b in blocks)


def _pod(**template):
    t = ks.PodTemplate(namespace=SANDBOX_NS, image="registry.example/execbox/python:1", **template)
    return ks.pod_manifest(t, name="execbox-default-0123456789ab", token="t" * 64, configmap="execbox-agent-x",
                           labels={ks.L_STATE: ks.WARM}, annotations={ks.A_EXPIRES: "1"})


@pytest.mark.parametrize("template", [{}, {"runtime_class": "gvisor", "node_selector": {"pool": "sandbox"},
                                           "tolerations": [{"key": "sandbox", "operator": "Exists",
                                                            "effect": "NoSchedule"}],
                                           "memory": "1Gi", "cpu_limit": "2"},
                                      {"user_namespaces": True}])
def test_generated_pod_spec_is_valid_and_hardened(template):
    pod = _pod(**template)
    validate(pod)
    assert_hardened_pod_spec(pod["spec"], box=True)
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "execbox-box"  # what the NetworkPolicy selects
    if "runtime_class" in template:
        assert pod["spec"]["runtimeClassName"] == "gvisor" and pod["spec"]["tolerations"][0]["key"] == "sandbox"
    assert pod["spec"].get("hostUsers", True) is not template.get("user_namespaces", False)


def test_validation_rejects_a_broken_pod():
    """The schema check can fail: a typo and a wrong type are both caught."""
    pod = _pod()
    pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True  # wrong case
    with pytest.raises(kv.ValidationError):
        validate(pod)
    pod = _pod()
    pod["spec"]["activeDeadlineSeconds"] = "soon"
    with pytest.raises(kv.ValidationError):
        validate(pod)


def test_agent_configmap_fits_and_carries_the_agent():
    cm = ks.agent_configmap(SANDBOX_NS)
    validate(cm)
    assert {"main.py", "tcp_relay.py", "protocol.py", "js_runner.js"} <= set(cm["data"])
    assert len(json.dumps(cm["data"])) < 900 * 1024  # ConfigMaps are limited to 1 MiB


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed: kustomize_lite alone renders")
@pytest.mark.parametrize("target", TARGETS)
def test_kustomize_lite_matches_kubectl_kustomize(target):
    out = subprocess.run(["kubectl", "kustomize", os.path.join(ROOT, target)], capture_output=True, text=True,  # noqa: S607
                         check=True, timeout=60).stdout
    key = lambda d: (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])  # noqa: E731
    assert sorted(yaml.safe_load_all(out), key=key) == sorted(render(os.path.join(ROOT, target)), key=key)
