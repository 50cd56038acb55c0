"""Does the sandbox namespace isolate box pods? A check of its NetworkPolicies at initialize.

``network: none`` (and the egress proxy as the only way out for the other modes) is enforced by
the cluster, not by execbox: by a NetworkPolicy that selects the box pods with policy type
Egress (deploy/kubernetes/base/networkpolicy-sandbox.yaml), and a CNI that enforces it. The
provider can only see the first half: it lists the namespace's policies and warns when none
isolates the box pods, or when it may not list them. A CNI that ignores NetworkPolicy cannot be
seen from the API at all (docs/kubernetes.md).
"""

from __future__ import annotations

from typing import Any

from ..boxes import k8s_spec as ks
from ..boxes.k8s_api import PodApi
from ..errors import SandboxError

POLICY_FILE = "deploy/kubernetes/base/networkpolicy-sandbox.yaml"


def _selects(policy: Any, labels: dict[str, str]) -> bool:
    """Whether the policy's podSelector surely selects a pod with ``labels`` (expressions: not counted)."""
    sel = policy.spec.pod_selector if policy.spec is not None else None
    if sel is None:
        return False
    if sel.match_expressions:
        return False  # not evaluated here: a policy counts only when it surely applies
    return all(labels.get(k) == v for k, v in (sel.match_labels or {}).items())


def _types(policy: Any) -> set[str]:
    """policyTypes, with the API's default when unset: Ingress, plus Egress if it has egress rules."""
    spec = policy.spec
    if spec.policy_types:
        return set(spec.policy_types)
    return {"Ingress"} | ({"Egress"} if spec.egress is not None else set())


def isolation_warnings(api: PodApi, template_labels: list[str]) -> list[str]:
    """Warnings for ``warnings()``: box pods not isolated by a NetworkPolicy, or not checkable."""
    try:
        policies = api.list_network_policies()
    except SandboxError as e:
        why = "the gateway may not list networkpolicies" if e.details.get("status") in (401, 403) else e.message
        return [f"could not check the NetworkPolicies of namespace {api.ns} ({why}): box pods are isolated only "
                f"if a default-deny policy ({POLICY_FILE}) is installed and the CNI enforces it"]
    missing = []
    for direction in ("Egress", "Ingress"):
        for template in template_labels:
            labels = {**ks.MANAGED, ks.L_TEMPLATE: template}
            if not any(_selects(p, labels) and direction in _types(p) for p in policies):
                missing.append(direction)
                break
    if not missing:
        return []
    what = {"Egress": "egress (network: none does not hold: they reach the cluster network, the API "
                      "server and the metadata endpoint)",
            "Ingress": "ingress (any pod can reach their agent port)"}
    return [f"no NetworkPolicy in namespace {api.ns} isolates the box pods' " + " or ".join(what[m] for m in missing)
            + f"; install {POLICY_FILE} (and use a CNI that enforces NetworkPolicy)"]
