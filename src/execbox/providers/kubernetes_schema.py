"""Config schema of the ``kubernetes`` provider (the pod template and the pool/sweeper knobs)."""

from __future__ import annotations

import re
from typing import Any

from ..boxes import k8s_spec as ks
from ..boxes.images import DEFAULT_IMAGE
from .agent_backed import POLICY_SCHEMA, TIMEOUT_SCHEMA
from .kubernetes_egress import egress_problem, egress_schema

SECRET_ENV = "EXECBOX_K8S_AGENT_SECRET"
QUANTITY_FIELDS = ("cpu_request", "cpu_limit", "memory", "workspace_size", "tmp_size")


def config_schema() -> dict[str, dict[str, Any]]:
    def s(default: str, label: str, desc: str, **kw: Any) -> dict[str, Any]:
        return {"type": "string", "default": default, "label": label, "description": desc, **kw}

    def n(kind: str, default: Any, lo: Any, hi: Any, label: str, desc: str) -> dict[str, Any]:
        return {"type": kind, "default": default, "min": lo, "max": hi, "label": label, "description": desc}

    return {
        "namespace": s("execbox-sandboxes", "Sandbox namespace", "Namespace the box pods run in (not the "
                       "gateway's)."),
        "template": s("default", "Template name", "Pod template name; one warm pool per template (label "
                      "execbox.dev/template).", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"),
        "image": s(DEFAULT_IMAGE, "Worker image", "The Docker provider's worker image, pushed to a registry "
                   "the cluster pulls from."),
        "image_pull_policy": s("IfNotPresent", "Image pull policy", "Always, IfNotPresent or Never.",
                               options=["Always", "IfNotPresent", "Never"]),
        "runtime_class": s("", "RuntimeClass", "runtimeClassName for box pods, e.g. gvisor; empty = the "
                           "cluster default (runc: tier 'container')."),
        "user_namespaces": {"type": "boolean", "default": False, "label": "User namespaces",
                            "description": "hostUsers: false for box pods (Kubernetes >= 1.33, or 1.30+ with the "
                                           "UserNamespacesSupport gate; Linux >= 6.3 nodes): uid 1000 in a pod "
                                           "maps to a host uid range of its own, so pods share no host uid, "
                                           "its processes, or its per-user kernel limits with each other or "
                                           "the node's own uid 1000."},
        "cpu_request": s("250m", "CPU request", "Kubernetes quantity."),
        "cpu_limit": s("1", "CPU limit", "Kubernetes quantity."),
        "memory": s("512Mi", "Memory", "Request and limit (Kubernetes quantity)."),
        "workspace_size": s("1Gi", "Workspace size", "sizeLimit of the emptyDir /workspace."),
        "tmp_size": s("64Mi", "/tmp size", "sizeLimit of the memory-backed /tmp."),
        "node_selector": {"type": "json", "default": {}, "label": "Node selector",
                          "description": "nodeSelector for box pods (object of strings)."},
        "tolerations": {"type": "json", "default": [], "label": "Tolerations",
                        "description": "tolerations for box pods (list of Toleration objects)."},
        "templates": {"type": "json", "default": {}, "label": "Named templates",
                      "description": "More pod templates, each with its own warm pool: {name: {key: value}} "
                                     "overriding image, runtime_class, user_namespaces, cpu_request, cpu_limit, "
                                     "memory, "
                                     "workspace_size, tmp_size, node_selector, tolerations, pool_size, preload, "
                                     "pids_limit. create_instance(template=name) uses one; other names use the "
                                     "top-level template."},
        "pids_limit": n("integer", 128, 16, 4096, "Pids limit (gVisor)", "With runtime_class=gvisor or "
                        "user_namespaces: the agent's RLIMIT_NPROC inside the box. Otherwise pods rely on the "
                        "kubelet's podPidsLimit."),
        "pool_size": n("integer", 2, 0, 200, "Warm pool size", "Ready pods kept per template by this replica."),
        "pool_wait": n("number", 30, 0, 600, "Pool wait (s)", "How long create_instance waits for a pooled pod "
                       "before starting one itself."),
        "ready_timeout": n("number", 120, 5, 1800, "Ready timeout (s)", "A pod not Ready by then is deleted "
                           "(SB004 with its status)."),
        "api_timeout": n("number", 10, 1, 120, "API timeout (s)", "Per-request timeout on the API server (SB009 "
                         "past it)."),
        "max_lifetime": n("integer", 86400, 60, 604800, "Max pod lifetime (s)", "activeDeadlineSeconds of every "
                          "box pod; sessions cannot outlive it."),
        "warm_ttl": n("integer", 3600, 60, 86400, "Warm pod TTL (s)", "An unclaimed pod older than this is "
                      "recycled; pods of a crashed replica are swept after it."),
        "sweep_interval": n("number", 30, 0.2, 3600, "Sweep interval (s)", "How often ended, expired and orphaned "
                            "pods are deleted."),
        "agent_port": n("integer", ks.AGENT_PORT, 1024, 65535, "Agent port", "Pod port of the agent relay."),
        "agent_secret": s("", "Agent secret", f"Shared by all gateway replicas (or env {SECRET_ENV}); per-pod "
                          "secrets derive from it. Empty = random per process (no takeover across replicas).",
                          secret=True),
        "kubeconfig": s("", "Kubeconfig", "Path; empty = in-cluster config when running in a pod, else "
                        "KUBECONFIG / ~/.kube/config."),
        "context": s("", "Context", "kubeconfig context; empty = current."),
        "preload": s("auto", "Preload modules", "'auto', 'none', or a comma-separated list ('auto,torch')."),
        **TIMEOUT_SCHEMA,
        "max_output_bytes": n("integer", 1048576, 1024, 64 * 1048576, "Output cap (bytes)",
                              "Cap on stdout and stderr each."),
        **POLICY_SCHEMA,
        **egress_schema(),
    }


DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
TEMPLATE_KEYS = {"image", "runtime_class", "user_namespaces", "cpu_request", "cpu_limit", "memory", "workspace_size",
                 "tmp_size", "node_selector", "tolerations", "pool_size", "preload", "pids_limit"}


def _template_problem(c: dict[str, Any], where: str) -> str | None:
    """What is wrong with one template's keys (quantities, selectors, tolerations, name), or None."""
    for key in QUANTITY_FIELDS:
        if not ks.QUANTITY.fullmatch(str(c.get(key, ""))):
            return f"{where}{key}: {c.get(key)!r} is not a Kubernetes quantity (e.g. 500m, 1, 512Mi)"
    sel = c.get("node_selector") or {}
    if not isinstance(sel, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in sel.items()):
        return f"{where}node_selector: must be an object of strings"
    tol = c.get("tolerations") or []
    if not isinstance(tol, list) or not all(isinstance(t, dict) for t in tol):
        return f"{where}tolerations: must be a list of objects"
    if not DNS_LABEL.fullmatch(str(c.get("template", ""))):
        return "template: must be a DNS label (lower-case letters, digits, '-')"
    return None


def config_problem(config: dict[str, Any]) -> str | None:
    """What is wrong with a checked config (top level and every named template), or None."""
    problem = _template_problem(config, "") or egress_problem(config)
    if problem:
        return problem
    templates = config.get("templates") or {}
    if not isinstance(templates, dict):
        return "templates: must be an object of {name: {key: value}}"
    for name, overrides in templates.items():
        if not isinstance(overrides, dict) or not DNS_LABEL.fullmatch(f"{config.get('template')}-{name}"):
            return f"templates.{name}: needs a DNS-label name and an object of overrides"
        unknown = set(overrides) - TEMPLATE_KEYS
        if unknown:
            return f"templates.{name}: unknown keys {sorted(unknown)} (allowed: {sorted(TEMPLATE_KEYS)})"
        problem = _template_problem({**config, **overrides}, f"templates.{name}.")
        if problem:
            return problem
    return None
