"""Kubernetes objects for boxes, as plain dicts: the hardened pod, the agent ConfigMap, labels.

Plain dicts (not the client's model classes) so the same builder feeds the API, the offline
schema validation in the tests and ``podman kube play``. Every hardening item of issue 18 is set
here, in one place: non-root uid, read-only root, all capabilities dropped, RuntimeDefault
seccomp, no privilege escalation, no service-account token, no host namespaces, size-limited
emptyDir workspace and /tmp, and a lifetime bound (activeDeadlineSeconds).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..agent import SHIPPED_SUFFIXES
from .box import AGENT_BOOT, agent_source_dir
from .images import AGENT_ROOT, ENV, PYTHON, SANDBOX_UID, WORKSPACE

GROUP = "execbox.dev"
MANAGED = {"app.kubernetes.io/managed-by": "execbox", "app.kubernetes.io/name": "execbox-box"}
"""Labels on every box pod; the sandbox NetworkPolicies select pods by them."""
L_TEMPLATE, L_STATE, L_TENANT, L_SESSION, L_INSTANCE = (f"{GROUP}/{k}" for k in
                                                        ("template", "state", "tenant", "session", "instance"))
A_TENANT, A_SESSION, A_INSTANCE, A_EXPIRES, A_OWNER = (f"{GROUP}/{k}" for k in
                                                       ("tenant-id", "session-id", "instance-id", "expires-at",
                                                        "owner"))
A_REGISTRY, A_REPLICA, A_REGISTERED = (f"{GROUP}/{k}" for k in ("registry", "replica", "registered-at"))
"""Annotations of a session pod started for a persistent session registry: which registry (the
service's workspaces root, whose last part is the database's identity), which replica, and when
(providers/kubernetes_handover.py ``mark_box``)."""
A_READY_BY = f"{GROUP}/ready-by"
"""Unix time by which the creating replica gives up on a pod that is not Ready (its own
``ready_timeout``): any replica's sweeper counts a pod as stuck from that time, not its own."""
L_EGRESS, A_EGRESS = f"{GROUP}/egress", f"{GROUP}/egress-policy"
"""``execbox.dev/egress: "on"`` only on a claimed pod whose policy is not none (the sandbox
NetworkPolicy opens the path to the gateway's egress proxy for those pods only); the policy
itself is the annotation (JSON ``{"network", "allow"}``), read by any gateway replica's proxy."""
PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "npm_config_proxy",
             "npm_config_https_proxy")
NO_PROXY = "localhost,127.0.0.1,::1"  # the box's own loopback (a server it runs) stays direct
WARM, CLAIMED, ENDED = "warm", "claimed", "ended"
"""``ended``: the session is gone but deleting its pod failed; any replica's sweeper deletes it."""
AGENT_PORT = 7070
AGENT_CONTAINER = "agent"
AGENT_FILES = SHIPPED_SUFFIXES
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$")


def label_value(text: str) -> str:
    """A label-safe stand-in for a free-form id (tenant, session, instance): a short digest.

    Label values are limited to 63 chars of [A-Za-z0-9_.-]; ids are not, so labels carry a
    digest for selection and annotations carry the id itself."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:40] if text else ""


def pod_token(secret: bytes, pod_name: str) -> str:
    """The per-pod agent secret: any gateway replica holding ``secret`` derives it from the name."""
    return hmac.new(secret, f"execbox-pod:{pod_name}".encode(), hashlib.sha256).hexdigest()


def egress_token(secret: bytes, pod_name: str) -> str:
    """The pod's egress-proxy password: derived like ``pod_token`` but with another label, so the
    token user code can read (it is in the proxy URL of the pod's env) never opens the agent."""
    return hmac.new(secret, f"execbox-egress:{pod_name}".encode(), hashlib.sha256).hexdigest()


def proxy_env(proxy: str, pod_name: str, token: str) -> list[dict[str, str]]:
    """HTTP(S)_PROXY (both cases, and npm's) naming the gateway's proxy with the pod's credentials;
    NO_PROXY/no_proxy only the loopback names, so a server the box runs itself is reached directly
    (the proxy would refuse loopback) and everything else goes through the proxy."""
    url = f"http://{pod_name}:{token}@{proxy}"
    return [{"name": k, "value": url} for k in PROXY_ENV] + [{"name": k, "value": NO_PROXY}
                                                           for k in ("NO_PROXY", "no_proxy")]


def agent_files() -> dict[str, str]:
    """The in-box agent package as ConfigMap data (stdlib-only sources, well under 1 MiB)."""
    src = agent_source_dir()
    out = {}
    for name in sorted(os.listdir(src)):
        if name.endswith(AGENT_FILES):
            with open(os.path.join(src, name), encoding="utf-8") as fh:
                out[name] = fh.read()
    return out


def agent_configmap(namespace: str) -> dict[str, Any]:
    """The agent sources, named by their digest so pods of different execbox versions coexist."""
    files = agent_files()
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:12]
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"execbox-agent-{digest}", "namespace": namespace, "labels": dict(MANAGED)},
            "data": files}


@dataclass
class PodTemplate:
    """What the operator chooses per template (provider config); everything else is fixed."""

    namespace: str
    image: str
    name: str = "default"
    image_pull_policy: str = "IfNotPresent"
    runtime_class: str = ""
    user_namespaces: bool = False  # hostUsers: false (the pod's uids map to a host range of its own)
    cpu_request: str = "250m"
    cpu_limit: str = "1"
    memory: str = "512Mi"
    workspace_size: str = "1Gi"
    tmp_size: str = "64Mi"
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    preload: str = "auto"
    agent_limits: dict[str, Any] = field(default_factory=dict)
    max_lifetime: int = 86400
    port: int = AGENT_PORT
    egress_proxy: str = ""  # host:port of the gateway's egress proxy ("" = no proxy env in pods)


def container_security_context() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": SANDBOX_UID, "runAsGroup": SANDBOX_UID, "privileged": False,
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def pod_manifest(t: PodTemplate, *, name: str, token: str, configmap: str, labels: dict[str, str],
                 annotations: dict[str, str], deadline: int | None = None,
                 egress_token: str = "") -> dict[str, Any]:
    """The hardened box pod. ``deadline`` (activeDeadlineSeconds) defaults to the template's lifetime."""
    command = [PYTHON, "-I", "-c", AGENT_BOOT, AGENT_ROOT, "execbox_agent.tcp_relay", "--port", str(t.port), "--",
               "--workspace", WORKSPACE, "--preload", t.preload, "--limits", json.dumps(t.agent_limits, sort_keys=True)]
    env = [{"name": k, "value": v} for k, v in sorted(ENV.items())]
    env.append({"name": "EXECBOX_AGENT_TOKEN", "value": token})
    if t.egress_proxy and egress_token:
        env.extend(proxy_env(t.egress_proxy, name, egress_token))
    container = {
        "name": AGENT_CONTAINER, "image": t.image, "imagePullPolicy": t.image_pull_policy,
        "command": command, "workingDir": WORKSPACE, "env": env,
        "ports": [{"name": "agent", "containerPort": t.port, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": t.port}, "periodSeconds": 1, "failureThreshold": 1},
        "resources": {"requests": {"cpu": t.cpu_request, "memory": t.memory},
                      "limits": {"cpu": t.cpu_limit, "memory": t.memory}},
        "securityContext": container_security_context(),
        "volumeMounts": [{"name": "workspace", "mountPath": WORKSPACE},
                         {"name": "tmp", "mountPath": "/tmp"},
                         {"name": "agent", "mountPath": f"{AGENT_ROOT}/execbox_agent", "readOnly": True}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False, "hostPID": False, "hostIPC": False,
        "terminationGracePeriodSeconds": 2,
        "activeDeadlineSeconds": int(deadline or t.max_lifetime),
        "securityContext": {"runAsNonRoot": True, "runAsUser": SANDBOX_UID, "runAsGroup": SANDBOX_UID,
                            "fsGroup": SANDBOX_UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "workspace", "emptyDir": {"sizeLimit": t.workspace_size}},
                    {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": t.tmp_size}},
                    {"name": "agent", "configMap": {"name": configmap, "defaultMode": 0o444}}],
    }
    if t.runtime_class:
        spec["runtimeClassName"] = t.runtime_class
    if t.user_namespaces:
        spec["hostUsers"] = False
    if t.node_selector:
        spec["nodeSelector"] = dict(t.node_selector)
    if t.tolerations:
        spec["tolerations"] = [dict(x) for x in t.tolerations]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": t.namespace,
                         "labels": {**MANAGED, L_TEMPLATE: t.name, **labels}, "annotations": dict(annotations)},
            "spec": spec}
