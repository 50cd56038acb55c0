"""What the session registry needs from the Kubernetes provider to keep sessions across restarts,
hand them over between replicas and clean up after dead ones (the Docker provider's counterpart is
docker_sessions.py; the service side is service/sessions/lifecycle.py, admin.py and drain.py).

A session's box handle names its pod (``box_id``, from the instance metadata) and its instance id,
which the pod carries as a label and annotation. On SIGTERM the service *detaches* (closes its agent
connection, leaves the pod running); the next start, or any replica that takes the session over,
*adopts* it (finds the pod by instance, and the agent's relay lets the new connection take over
with its contexts intact). A session box started for a persistent registry is *marked* with that
registry (annotations) once its row names it; pods so marked that no registry row refers to are
removed at start and then every few minutes (service/sessions/boxes.py ``remove_orphan_boxes``).

No adoption brings back a destroyed instance: this replica remembers the ids it destroyed, and
refuses any replica's pod that is being deleted or marked ``ended`` (``destroy_instance`` marks it
before it returns, while the pod's delete still waits in the reaper and the pod is still Ready).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..boxes import k8s_spec as ks
from ..boxes.k8s_box import PodApi, PodBox, connect_agent, pod_addresses, pod_ending, pod_failure, pod_ready
from ..errors import InstanceCreationError, ProviderUnavailableError, SandboxError, SessionNotFoundError
from ..models import SandboxInstance
from .agent_backed import Instance

if TYPE_CHECKING:
    import threading

log = logging.getLogger("execbox.provider.kubernetes")

DESTROYED_CAP = 10000
"""Most instance ids a replica remembers as destroyed (the oldest are forgotten first). Past that
an old id is refused only by its pod's state: gone, being deleted, or labelled ``ended``."""


class KubernetesHandoverMixin:
    api: PodApi | None
    name: str
    templates: dict[str, ks.PodTemplate]
    _instances: dict[str, Instance]
    _lock: threading.Lock
    _secret: bytes
    config: dict[str, Any]
    orphan_grace = 120.0
    """Seconds after its marking before a pod no registry row names counts as an orphan: a replica
    that read the rows just before a session's row was written must not take its pod for one."""
    shared_secret = True
    """False when ``agent_secret`` is random per process: no pod an earlier process (or another
    replica) started can be authenticated to, so none can be re-attached."""

    def __init__(self) -> None:
        super().__init__()
        self._unanswered: dict[str, float] = {}  # pod -> when an adoption first found it silent
        self._destroyed: OrderedDict[str, None] = OrderedDict()  # instance ids destroyed here (DESTROYED_CAP)

    if TYPE_CHECKING:
        def _require_initialized(self) -> None: ...
        def _get(self, instance_id: str) -> Instance: ...
        def _find_pod(self, instance_id: str) -> Any | None: ...
        def _remove_later(self, job: Callable[[], None]) -> None: ...
        def _delete_failed(self, name: str, err: SandboxError) -> None: ...
        def policy_of(self, pod: Any) -> Any: ...
        def destroy_instance(self, instance_id: str) -> bool: ...

    def _remember_destroyed(self, instance_id: str) -> None:
        """Refuse ``instance_id`` from now on: no adoption brings it back (called under ``_lock``)."""
        self._destroyed[instance_id] = None
        self._destroyed.move_to_end(instance_id)
        while len(self._destroyed) > DESTROYED_CAP:
            self._destroyed.popitem(last=False)

    def _adopt(self, instance_id: str) -> None:
        """Take over the instance's Ready pod (another replica created it, or this process before a
        restart): nothing happens when it has none, or one not Ready or failed (the caller then finds
        no instance). SessionNotFoundError when the instance was destroyed: here (remembered), or by
        any replica (its pod is being deleted or labelled ``ended``)."""
        gone = f"instance {instance_id!r} was destroyed"
        if instance_id in self._destroyed:
            raise SessionNotFoundError(gone, details={"instance_id": instance_id})
        pod = self._find_pod(instance_id)
        if pod is None or not pod_ready(pod) or pod_failure(pod):
            return
        why = pod_ending(pod)
        if why:
            raise SessionNotFoundError(f"{gone} ({why})", details={"instance_id": instance_id})
        assert self.api is not None
        ann, name = pod.metadata.annotations or {}, pod.metadata.name
        client = connect_agent(pod.status.pod_ip, int(self.config["agent_port"]), ks.pod_token(self._secret, name),
                               name)
        box = PodBox(name, client, self.api, pod.status.pod_ip, pod_addresses(pod))
        box.remover = self._remove_later
        box.on_delete_failed = self._delete_failed
        box.claimed = {"tenant": ann.get(ks.A_TENANT, ""), "session": ann.get(ks.A_SESSION, ""),
                       "instance": instance_id}
        inst = Instance(instance_id, box, ann.get(ks.A_TENANT, ""), ann.get(ks.A_SESSION) or None,
                        egress=self.policy_of(pod))
        with self._lock:  # destroyed while this connected: not registered
            destroyed = instance_id in self._destroyed
            held = None if destroyed else self._instances.setdefault(instance_id, inst)
        if held is inst:
            log.info("kubernetes: adopted %s from pod %s", instance_id, name)
            return
        box.destroyed = True  # only our connection goes: the pod is its holder's (or being deleted)
        client.close()
        if destroyed:
            raise SessionNotFoundError(gone, details={"instance_id": instance_id})

    def _instance_metadata(self, inst: Instance) -> dict[str, Any]:
        meta = super()._instance_metadata(inst)  # type: ignore[misc]
        if isinstance(inst.box, PodBox) and inst.session_id is not None:
            meta["box_id"] = inst.box.name  # recorded in the session's box handle
        return meta

    def mark_box(self, instance_id: str, labels: dict[str, str]) -> None:
        """Record on a session's pod the registry (and replica) it was started for, so that
        ``remove_orphans`` of a service on that registry, and only of one, may remove it."""
        with self._lock:
            inst = self._instances.get(instance_id)
        if inst is None or not isinstance(inst.box, PodBox) or self.api is None:
            return
        box, api = inst.box, self.api
        ann = {ks.A_REGISTRY: labels.get("execbox.registry", ""), ks.A_REPLICA: labels.get("execbox.replica", ""),
               ks.A_REGISTERED: str(int(time.time()))}

        def run() -> None:
            if box.destroyed:
                return
            try:
                api.patch_pod(box.name, {"metadata": {"annotations": ann}})
            except SandboxError as e:  # unmarked, it is never taken for an orphan; it expires instead
                log.warning("kubernetes: marking pod %s with its registry failed: %s", box.name, e.message)

        self._remove_later(run)  # in the background, as the claim of a pooled pod is

    def no_shared_secret(self, notes: list[str], env: str) -> None:
        """``agent_secret`` is random per process: say (initialize's warnings, the log) that sessions
        survive neither this replica's restart nor a hand-over: their pods are deleted instead."""
        self.shared_secret = False
        note = (f"no agent_secret/{env}: sessions do not survive a restart of this replica (their pods are "
                "deleted at its next start) and other gateway replicas cannot take them over")
        notes.append(note)
        log.warning("kubernetes: %s", note)

    def adopt_instance(self, handle: dict[str, Any], *, tenant_id: str, session_id: str,
                       workspace: str | None = None) -> SandboxInstance | None:
        """Reconnect to the session's running pod (a restart, or a replica taking over). None, and
        the pod deleted, when it is gone or ended, or cannot be authenticated to (no shared
        ``agent_secret``). Raises SB009 while nothing can be told: the API does not answer, or
        the pod runs but is not Ready or its agent does not answer; the caller keeps the handle
        and tries again on the session's next use. A pod still silent ``ready_timeout`` s after
        this replica first found it so is taken for dead (deleted, None)."""
        self._require_initialized()
        instance_id = str(handle.get("instance_id") or "")
        name = str(handle.get("box_id") or "")
        if not instance_id or not name:
            return None
        with self._lock:
            local = instance_id in self._instances
        pod = None if local else self._find_pod(instance_id)  # no answer: raises, nothing known yet
        why = None if local else ("its pod is gone" if pod is None else pod_failure(pod) or pod_ending(pod))
        if not local and not why and not self.shared_secret:
            why = "no shared agent_secret: its agent cannot be authenticated to"
        try:
            if why:
                raise SessionNotFoundError(why)
            if not local and not pod_ready(pod):
                raise ProviderUnavailableError("its pod is not Ready")
            inst = self._get(instance_id)  # connects to the pod's agent
        except SandboxError as e:
            if isinstance(e, ProviderUnavailableError) and e.details.get("operation"):
                raise  # the API did not answer or refused: nothing to tell about the pod
            if isinstance(e, (ProviderUnavailableError, InstanceCreationError)) and not self._dead(name):
                raise ProviderUnavailableError(
                    f"the box of session {tenant_id}/{session_id} does not answer yet ({e.message}); retry",
                    details={"tenant_id": tenant_id, "session_id": session_id, "retry_after": 5}) from None
            log.info("kubernetes: cannot adopt %s: %s", instance_id, e.message)
            self._unanswered.pop(name, None)
            self.remove_box(handle)
            return None
        self._unanswered.pop(name, None)
        if inst.tenant_id != tenant_id or (inst.session_id or "") != session_id:
            log.warning("kubernetes: pod of %s belongs to %s/%s, not %s/%s", instance_id, inst.tenant_id,
                        inst.session_id, tenant_id, session_id)
            self.detach_instance(instance_id)
            return None
        return SandboxInstance(instance_id, self.name, "running", self._instance_metadata(inst))

    def _dead(self, pod: str) -> bool:
        """Whether a pod that runs but does not answer has done so for ``ready_timeout`` s (since
        this replica first found it so): then it is taken for dead."""
        first = self._unanswered.setdefault(pod, time.monotonic())
        if len(self._unanswered) > 10000:  # bounded: pods never looked at again
            self._unanswered.pop(next(iter(self._unanswered)), None)
        return time.monotonic() - first >= float(self.config["ready_timeout"])

    def detach_instance(self, instance_id: str) -> bool:
        """Leave a session's pod running for the next start or another replica (False: not a
        session pod here: the caller destroys it). A connection that is gone counts too: another
        replica that took the session over took the pod's agent connection with it; a pod that
        ended is the sweeper's, or deleted by whoever adopts the session next."""
        with self._lock:
            inst = self._instances.get(instance_id)
            if inst is None or inst.session_id is None or not isinstance(inst.box, PodBox):
                return False
            del self._instances[instance_id]
        with inst.box._destroy_lock:  # no teardown: only our agent connection goes
            inst.box.destroyed = True
        inst.box.client.close()
        return True

    def remove_box(self, handle: dict[str, Any]) -> None:
        """Delete a session's pod by its handle (a dead replica's session destroyed or reaped). A
        pod this replica holds, or finds by its instance, goes as ``destroy_instance`` deletes it:
        a delete the API refuses or misses there is queued (retried at every sweep, the pod marked
        ended) and this returns. Otherwise an API that refuses or does not answer (the pod's
        lookup or its delete) raises, so the caller keeps its row and tries again."""
        instance_id = str(handle.get("instance_id") or "")
        pod = str(handle.get("box_id") or "")
        if instance_id and self.destroy_instance(instance_id):  # a local box (or one found by instance)
            return
        if pod and self.api is not None:
            found = self.api.get_pod(pod)
            ann = (found.metadata.annotations or {}) if found is not None else {}
            if found is not None and ann.get(ks.A_INSTANCE, instance_id) in (instance_id, ""):
                self.api.delete_pod(pod)
                log.info("kubernetes: deleted pod %s of %s", pod, instance_id or "an unknown instance")

    def remove_orphans(self, keep: set[str], registry: str) -> int:
        """Delete session pods marked with this ``registry`` that no registry row refers to
        (``keep``: the box ids of every row, any replica's). Pods of other registries, unmarked
        pods (one-shots, or sessions of a service without a shared registry), warm pods and pods
        marked less than ``orphan_grace`` s ago are left alone."""
        if self.api is None or not registry:
            return 0
        labels = {t.name for t in self.templates.values()}
        with self._lock:
            local = {getattr(i.box, "name", "") for i in self._instances.values()}
        now = time.time()
        removed = 0
        for pod in self.api.list_pods(f"app.kubernetes.io/managed-by=execbox,{ks.L_STATE}={ks.CLAIMED}"):
            name = pod.metadata.name
            ann = pod.metadata.annotations or {}
            if (pod.metadata.labels or {}).get(ks.L_TEMPLATE) not in labels or ann.get(ks.A_REGISTRY) != registry:
                continue
            if name in keep or ann.get(ks.A_INSTANCE) in keep or name in local or not ann.get(ks.A_SESSION):
                continue
            try:
                marked = float(ann.get(ks.A_REGISTERED) or now)
            except ValueError:
                marked = now
            if now - marked < self.orphan_grace:
                continue
            if self.api.delete_pod(name):
                removed += 1
                log.info("kubernetes: deleted pod %s of %s: no session in the registry", name,
                         ann.get(ks.A_INSTANCE))
        return removed
