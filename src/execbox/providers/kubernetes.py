"""Provider ``kubernetes``: each box is a hardened pod running the same agent image as ``docker``.

Execution semantics are AgentBackedProvider's: this module only creates, finds and deletes pods
(boxes/k8s_box.py, boxes/k8s_spec.py). All state lives on the pods (labels for selection,
annotations for the full ids and the expiry), so gateway replicas are stateless: a replica that
does not know an instance finds its pod by label and reconnects (the agent's relay lets a newly
authenticated connection take over); the per-pod agent secret is derived from one shared
``agent_secret`` and the pod name. A sweeper lists the template's pods and deletes ended and
expired ones, whoever created them. See docs/kubernetes.md.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..boxes import k8s_spec as ks
from ..boxes.agent_client import BoxDied
from ..boxes.k8s_api import core_api
from ..boxes.k8s_box import PodApi, PodBox, start_pod
from ..boxes.pool import BoxPool
from ..errors import (
    InstanceCreationError,
    InvalidConfigError,
    OutOfMemoryError,
    ProviderUnavailableError,
    SandboxError,
)
from ..models import Isolation, SandboxInstance, make_instance_id
from .agent_backed import AGENT_GRACE, AgentBackedProvider, Instance
from .kubernetes_egress import KubernetesEgressMixin
from .kubernetes_handover import KubernetesHandoverMixin
from .kubernetes_netpol import isolation_warnings
from .kubernetes_schema import SECRET_ENV, config_problem, config_schema
from .kubernetes_sweep import PodSweeperMixin
from .preload import effective_preload

log = logging.getLogger("execbox.provider.kubernetes")

class KubernetesProvider(KubernetesHandoverMixin, KubernetesEgressMixin, PodSweeperMixin, AgentBackedProvider):
    name = "kubernetes"
    display_name = "Kubernetes pods"
    description = "Hardened pods on a cluster (gVisor with runtime_class=gvisor), warm pool per template."
    tags = ["self-hosted", "kubernetes", "container", "gvisor"]
    isolation = Isolation.CONTAINER  # an initialized provider with a gvisor RuntimeClass reports gvisor
    zero_config = False
    failed_grace = 10.0  # seconds an ended pod is left for its owner to read its status before sweeping

    def __init__(self) -> None:
        super().__init__()
        self.api: PodApi | None = None
        self.template: ks.PodTemplate | None = None
        self.templates: dict[str, ks.PodTemplate] = {}
        self._named_pools: dict[str, BoxPool] = {}
        self.configmap = ""
        self.owner = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        self._secret = b""
        self._notes: list[str] = []
        self._reaper: ThreadPoolExecutor | None = None
        self._sweeper: threading.Thread | None = None
        self._stop = threading.Event()
        self._failed_since: dict[str, float] = {}

    @staticmethod
    def get_config_schema() -> dict[str, dict[str, Any]]:
        return config_schema()

    def validate_config(self, config: dict[str, Any]) -> tuple[bool, str | None]:
        problem = config_problem(config)
        return (problem is None), problem

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        if os.environ.get("KUBERNETES_SERVICE_HOST") or os.environ.get("KUBECONFIG") or \
                os.path.exists(os.path.expanduser("~/.kube/config")):
            return True, "a kubeconfig or in-cluster service account is present"
        return False, "no kubeconfig and not running in a pod"

    def health_check(self) -> bool:
        if not self.initialized or self.api is None:
            return False
        try:
            self.api.list_pods(f"{ks.L_TEMPLATE}={self.config['template']},{ks.L_STATE}=none")
            self.ensure_agent_configmap()  # gone (namespace wiped): every pod would wait in ContainerCreating
            return True
        except SandboxError:
            return False

    # -- lifecycle --------------------------------------------------------------------------
    def _core(self) -> Any:
        return core_api(self.config["kubeconfig"], self.config["context"])

    def prepare(self) -> None:
        c = self.config
        secret = c["agent_secret"] or os.environ.get(SECRET_ENV, "")
        self._notes, self.shared_secret = [], bool(secret)
        if not secret:
            secret = secrets.token_hex(32)
            self.no_shared_secret(self._notes, SECRET_ENV)  # kubernetes_handover.py
        self._secret = secret.encode()
        self.api = PodApi(self._core(), c["namespace"], float(c["api_timeout"]))
        self._configmap_body = ks.agent_configmap(c["namespace"])
        self.api.ensure_configmap(self._configmap_body)  # first API call: RBAC and reachability fail here
        self.configmap = self._configmap_body["metadata"]["name"]
        # One PodTemplate per template: the top-level keys ("default") plus each entry of `templates`
        # (its keys override the top level); each gets its own warm pool and template label.
        self.templates = {"default": self._pod_template(c["template"], c)}
        for tname, overrides in (c.get("templates") or {}).items():
            self.templates[tname] = self._pod_template(f"{c['template']}-{tname}", {**c, **overrides})
        self.template = self.templates["default"]
        self._notes += isolation_warnings(self.api, [t.name for t in self.templates.values()])
        self._prepare_egress()  # the provider's network policy; serves the egress proxy (kubernetes_egress.py)
        for t in self.templates.values():
            t.egress_proxy = self.egress_proxy_address
        # The tier is claimed only when every template runs under gVisor (never over-claimed).
        if all(t.runtime_class == "gvisor" for t in self.templates.values()):
            self.isolation = Isolation.GVISOR
        self._reaper = ThreadPoolExecutor(max_workers=2, thread_name_prefix="execbox-k8s-reaper")
        self._stop.clear()
        self._sweeper = threading.Thread(target=self._sweep_loop, name="execbox-k8s-sweeper", daemon=True)
        self._sweeper.start()
        self._named_pools = {}
        for tname, overrides in (c.get("templates") or {}).items():
            size = int(overrides.get("pool_size", c["pool_size"]) or 0)
            if size:
                self._named_pools[tname] = BoxPool(functools.partial(self.start_box, template=tname), size,
                                                   name=f"{self.name}-{tname}")

    def _pod_template(self, label: str, c: dict[str, Any]) -> ks.PodTemplate:
        from kubernetes.utils import parse_quantity

        # As in the docker provider: the agent's per-run data limit sits below the pod's memory limit,
        # so most bombs end in a clean MemoryError (SB006) and the OOM killer stays the backstop.
        pod_memory = int(parse_quantity(c["memory"]))
        memory_bytes = pod_memory * 8 // 10
        preload, note = effective_preload(c["preload"] or "auto", c["runtime_class"] or "", pod_memory)
        if note:
            self._notes.append(f"template {label}: {note}")
            log.warning("kubernetes: template %s: %s", label, note)
        t = ks.PodTemplate(
            namespace=c["namespace"], image=c["image"], name=label, image_pull_policy=c["image_pull_policy"],
            runtime_class=c["runtime_class"], user_namespaces=bool(c.get("user_namespaces")),
            cpu_request=c["cpu_request"], cpu_limit=c["cpu_limit"],
            memory=c["memory"], workspace_size=c["workspace_size"], tmp_size=c["tmp_size"],
            node_selector=dict(c.get("node_selector") or {}), tolerations=list(c.get("tolerations") or []),
            preload=preload, agent_limits={"memory_bytes": memory_bytes, "fsize_bytes": 256 * 1024**2,
                                                          "nofile": 1024},
            max_lifetime=int(c["max_lifetime"]), port=int(c["agent_port"]))
        if c["runtime_class"] == "gvisor" or c.get("user_namespaces"):
            # per sandbox (gVisor) or per user namespace; under plain runc it would count uid 1000 node-wide
            t.agent_limits["nproc"] = int(c["pids_limit"])
        return t

    def warnings(self) -> list[str]:
        return list(self._notes) + self.queue_warnings()  # kubernetes_sweep.py

    def applied_limits(self) -> dict[str, Any]:
        c = self.config
        return {**super().applied_limits(), "memory": c.get("memory"), "cpu_limit": c.get("cpu_limit"),
                "workspace_size": c.get("workspace_size"), "runtime_class": c.get("runtime_class") or None,
                "enforced_by": "kubernetes"}

    def pool_status(self) -> dict[str, Any] | None:
        status = super().pool_status()
        if status is not None:
            status.update({"template": self.config.get("template"), "namespace": self.config.get("namespace")})
        if self._named_pools:
            status = status or {}
            status["templates"] = {n: p.status() for n, p in self._named_pools.items()}
        return status

    # -- pods -------------------------------------------------------------------------------
    def pod_manifest(self, name: str, labels: dict[str, str] | None = None,
                     annotations: dict[str, str] | None = None, deadline: int | None = None,
                     template: str = "default") -> dict[str, Any]:
        now = int(time.time())
        ann = {ks.A_OWNER: self.owner, ks.A_EXPIRES: str(now + int(self.config["warm_ttl"])),
               ks.A_READY_BY: str(now + int(float(self.config["ready_timeout"]))), **(annotations or {})}
        return ks.pod_manifest(self.templates[template], name=name, token=ks.pod_token(self._secret, name),
                               configmap=self.configmap, labels={ks.L_STATE: ks.WARM, **(labels or {})},
                               annotations=ann, deadline=deadline, egress_token=self.egress_token(name))

    def start_box(self, workspace: str | None = None, template: str = "default", **claim: Any) -> PodBox:
        if workspace is not None:
            raise InvalidConfigError("the kubernetes provider has no host workspaces: a box's workspace is the "
                                     "pod's emptyDir", details={"provider": self.name, "field": "workspace"})
        assert self.api is not None
        # The template label is a DNS label (<= 63, config_problem); the pod name may be 253 long.
        name = f"execbox-{self.templates[template].name}-{uuid.uuid4().hex[:12]}"
        body = self.pod_manifest(name, template=template, **claim)
        try:
            box = start_pod(self.api, body, ks.pod_token(self._secret, name), int(self.config["agent_port"]),
                            float(self.config["ready_timeout"]))
        except InstanceCreationError as e:
            if "did not become ready" in e.message and self._configmap_recreated():
                raise InstanceCreationError(f"{e.message}; the agent ConfigMap was missing (now re-created): "
                                            "retry", details=e.details) from None
            raise
        box.remover = self._remove_later
        box.on_delete_failed = self._delete_failed
        return box

    def _configmap_recreated(self) -> bool:
        try:
            return self.ensure_agent_configmap()
        except SandboxError:
            return False

    def _claim(self, inst: Instance, *, background: bool) -> None:
        """Record the owner on the pod (labels + annotations); a one-shot also gets a short deadline."""
        assert isinstance(inst.box, PodBox)
        box = inst.box
        now = int(time.time())
        one_shot = inst.session_id is None
        ttl = int(self.config["max_timeout"]) + 2 * int(AGENT_GRACE) if one_shot else int(self.config["max_lifetime"])
        box.claimed = {"tenant": inst.tenant_id, "session": inst.session_id or "", "instance": inst.instance_id}
        patch: dict[str, Any] = {"metadata": {
            "labels": {ks.L_STATE: ks.CLAIMED, ks.L_TENANT: ks.label_value(inst.tenant_id),
                       ks.L_SESSION: ks.label_value(inst.session_id or ""),
                       ks.L_INSTANCE: ks.label_value(inst.instance_id)},
            "annotations": {ks.A_TENANT: inst.tenant_id, ks.A_SESSION: inst.session_id or "",
                            ks.A_INSTANCE: inst.instance_id, ks.A_EXPIRES: str(now + ttl)}}}
        if one_shot:  # activeDeadlineSeconds may only shrink on a running pod: age + the run's bound
            age = now - int(box.created_at)
            patch["spec"] = {"activeDeadlineSeconds": max(1, age + ttl)}

        def run() -> None:
            if box.destroyed:
                return
            try:  # with the egress policy current when the patch is sent (kubernetes_egress.py)
                self.patch_with_egress(inst, patch)
            except SandboxError as e:
                if not background:
                    raise
                log.warning("claiming pod %s failed; retried at every sweep: %s", box.name, e.message)
                self._unclaimed[box.name] = (inst, patch)

        if background:
            self._remove_later(run)
        else:
            run()

    def create_instance(self, template: str = "python", *, tenant_id: str = "default",  # type: ignore[override]
                        session_id: str | None = None) -> SandboxInstance:
        """A pooled pod (claimed in the background), else a cold start that carries its claim.

        No ``workspace`` parameter (unlike jail/docker): a pod cannot mount a gateway directory, and
        the session manager only passes host workspaces to providers whose signature takes one."""
        self._require_initialized()
        instance_id = make_instance_id(tenant_id, session_id)
        key = template if template in self.templates else "default"  # e.g. "python", "javascript"
        box = self._take_pooled(self._named_pools.get(key) if key != "default" else self._pool)
        inst = Instance(instance_id, box, tenant_id, session_id, from_pool=True) if box is not None else None
        if inst is None:
            try:
                box = self.start_box(template=key)
            except SandboxError:
                raise
            except Exception as e:  # noqa: BLE001
                raise InstanceCreationError(f"kubernetes: could not start a pod: {e}",
                                            details={"provider": self.name}) from e
            inst = Instance(instance_id, box, tenant_id, session_id)
        try:
            self._claim(inst, background=inst.from_pool)
        except SandboxError as e:  # an unclaimed pod is a warm one to every replica's sweeper: give it up
            box.destroy()
            raise ProviderUnavailableError(f"kubernetes: could not claim the new pod; nothing was created: "
                                           f"{e.message}", details={**e.details, "provider": self.name}) from None
        with self._lock:
            self._instances[instance_id] = inst
        return SandboxInstance(instance_id, self.name, "running", self._instance_metadata(inst))

    def _take_pooled(self, pool: BoxPool | None) -> PodBox | None:
        """A pooled pod, waiting up to ``pool_wait`` s while the pool is healthy; once it is failing
        (bad image, RBAC, API down) stop waiting: the cold start then fails with the precise reason."""
        if pool is None:
            return None
        deadline = time.monotonic() + float(self.config["pool_wait"])
        while True:
            box = pool.take(max(0.0, min(0.5, deadline - time.monotonic())))
            if box is not None or not pool.status()["healthy"] or time.monotonic() >= deadline:
                return box  # type: ignore[return-value]

    def _find_pod(self, instance_id: str) -> Any | None:
        if self.api is None:
            return None
        pods = self.api.list_pods(f"{ks.L_INSTANCE}={ks.label_value(instance_id)}")
        pods = [p for p in pods if (p.metadata.annotations or {}).get(ks.A_INSTANCE) == instance_id]
        return pods[0] if pods else None

    def _get(self, instance_id: str) -> Instance:
        """Local instance, or adopt it from its pod (another replica created it): stateless gateways.
        Never an instance destroyed here, nor a pod being deleted or ended (kubernetes_handover.py)."""
        self._require_initialized()
        if instance_id not in self._instances:
            self._adopt(instance_id)
        return super()._get(instance_id)

    def destroy_instance(self, instance_id: str) -> bool:
        """Delete the instance's pod; a delete the API refuses or misses is retried (sweep, shutdown).

        The id is refused from then on: this replica remembers it (bounded), and a local instance's
        pod, whose delete waits in the reaper, is labelled ``ended`` before this returns (one PATCH,
        best effort), so that no replica adopts it meanwhile (kubernetes_handover.py)."""
        with self._lock:
            inst = self._instances.get(instance_id)
            self._remember_destroyed(instance_id)
        if super().destroy_instance(instance_id):
            name = getattr(inst.box if inst else None, "name", "")
            self._egress_cache.pop(name, None)  # its grant ends
            if name:
                self._mark_ended(name)  # after box.destroy(): a background claim sent later cannot undo it
            return True
        pod = self._find_pod(instance_id) if self.initialized else None
        if pod is None or self.api is None:
            return False
        try:
            return self.api.delete_pod(pod.metadata.name)
        except SandboxError as e:
            self._delete_failed(pod.metadata.name, e)
            return True

    def instance_alive(self, instance_id: str) -> bool:
        try:
            return self._get(instance_id).box.alive()
        except SandboxError:
            return False

    def _box_died(self, inst: Instance, err: BoxDied) -> None:
        """Say why the pod went (OOMKilled, Evicted, DeadlineExceeded, deleted) and delete what is left."""
        assert isinstance(inst.box, PodBox)
        reason = None
        deadline = time.monotonic() + 3.0  # the kubelet reports the end a moment after the connection drops
        while not reason and time.monotonic() < deadline:
            reason = inst.box.status_reason()
            if not reason:
                time.sleep(0.3)
        inst.box.destroy()
        details = {"instance_id": inst.instance_id, "provider": self.name, "box_died": True,
                   "pod": inst.box.name, "pod_status": reason}
        if reason and "OOMKilled" in reason:
            raise OutOfMemoryError(f"the pod of {inst.instance_id} was OOM-killed ({reason})", details=details)
        raise ProviderUnavailableError(f"the pod of instance {inst.instance_id} ended: {reason or err.message}",
                                       details=details)

    def _remove_later(self, job: Any) -> None:
        reaper = self._reaper
        if reaper is None:
            job()
            return
        try:
            reaper.submit(job)
        except RuntimeError:  # shutting down
            job()

    def shutdown(self) -> None:
        self._stop.set()
        pools = [p for p in (self._pool, *self._named_pools.values()) if p is not None]
        for pool in self._named_pools.values():
            pool.close()
        self._named_pools = {}
        super().shutdown()  # closes the default pool (deleting its ready pods) and destroys local instances
        for pool in pools:
            pool.join(timeout=float(self.config.get("ready_timeout") or 60) + 10)
        if self._reaper is not None:
            self._reaper.shutdown(wait=True)
            self._reaper = None
        if self._sweeper is not None:
            self._sweeper.join(timeout=5)
            self._sweeper = None
        left = self.retry_deletes()  # gone sessions' pods whose delete failed
        if left:
            log.error("kubernetes: could not delete pods %s at shutdown (marked ended where the API let us: "
                      "any replica's sweeper deletes those)", left)
        if self.api is not None:
            try:  # pods this replica started that are still warm (a start racing shutdown)
                for pod in self.api.list_pods(f"app.kubernetes.io/managed-by=execbox,{ks.L_STATE}={ks.WARM}"):
                    if (pod.metadata.annotations or {}).get(ks.A_OWNER) == self.owner:
                        self.api.delete_pod(pod.metadata.name)
            except SandboxError as e:
                log.warning("kubernetes: final cleanup failed: %s", e.message)
