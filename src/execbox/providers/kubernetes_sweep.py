"""The pod sweeper: any replica deletes its templates' ended, expired and stuck pods.

Pods carry all their state (labels, annotations), so sweeping needs no coordination between
replicas; a local box whose pod is gone is marked dead with the reason its caller will see.
The sweeper also finishes what the API refused or did not answer: the deletes of pods whose
session is gone (marked ``state=ended`` when the API lets us, so any replica collects them), the
claims of pooled pods, and the agent ConfigMap (re-created when it is gone). A pod that a live
local instance holds is never deleted for its expiry or readiness: its claim is sent again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..boxes import k8s_spec as ks
from ..boxes.k8s_box import PodApi, PodBox, marked_ended, pod_failure, pod_ready
from ..boxes.pool import BoxPool
from ..errors import SandboxError
from .agent_backed import AgentBackedProvider, Instance

log = logging.getLogger("execbox.provider.kubernetes")


UNDELETED_CAP = 1000
"""Most failed deletes kept for retrying; past it another is only logged (the pod expires at its
deadline, or any replica deletes it once its ``ended`` mark landed)."""
RETRIES_PER_SWEEP = 50
"""Most failed deletes one sweep sends again."""


class PodSweeperMixin(AgentBackedProvider):
    api: PodApi | None
    templates: dict[str, ks.PodTemplate]
    _named_pools: dict[str, BoxPool]
    _failed_since: dict[str, float]
    _stop: threading.Event
    failed_grace: float
    _egress_cache: dict[str, Any]
    patch_with_egress: Callable[[Instance, dict[str, Any]], None]  # kubernetes_egress.py

    def __init__(self) -> None:
        super().__init__()
        self._undeleted: dict[str, bool] = {}  # pod -> marked ended: deletes to retry
        self._unclaimed: dict[str, tuple[Instance, dict[str, Any]]] = {}  # pod -> claim to send again
        self._configmap_body: dict[str, Any] | None = None

    # -- what the API did not do the first time ------------------------------------------
    def _delete_failed(self, name: str, err: SandboxError) -> None:
        """A gone session's pod the API did not delete: retried at every sweep and at shutdown."""
        if name not in self._undeleted and len(self._undeleted) >= UNDELETED_CAP:
            log.error("kubernetes: deleting pod %s failed and %d failed deletes are queued already (the API "
                      "refuses deletes: check the Role); not retried: %s", name, len(self._undeleted), err.message)
        else:
            log.warning("kubernetes: deleting pod %s failed; retried at every sweep and at shutdown: %s", name,
                        err.message)
            self._undeleted.setdefault(name, False)
        self._egress_cache.pop(name, None)  # its egress grant ends with the session
        self._mark_ended(name)

    def _mark_ended(self, name: str) -> None:
        """Best effort: label the pod ended and expired, so any replica's sweeper deletes it and none
        adopts it (a pod already gone needs no mark: nothing is logged for it)."""
        if self.api is None:
            return
        try:
            self.api.patch_pod(name, {"metadata": {"labels": {ks.L_STATE: ks.ENDED, ks.L_EGRESS: "off"},
                                                   "annotations": {ks.A_EXPIRES: str(int(time.time()))}}},
                               missing_ok=True)
        except SandboxError:
            return
        if name in self._undeleted:
            self._undeleted[name] = True

    def queue_warnings(self) -> list[str]:
        """The failed deletes still queued, as a warning (``warnings()``; ``pool_status`` counts them)."""
        n = len(self._undeleted)
        return [f"{n} session pods whose delete the API refused or missed are queued for retrying"] if n else []

    def pool_status(self) -> dict[str, Any] | None:
        status = super().pool_status()
        if self._undeleted:
            status = {**(status or {}), "undeleted_pods": len(self._undeleted)}
        return status

    def retry_deletes(self, limit: int | None = None) -> list[str]:
        """Delete the pods whose delete failed before (at most ``limit`` of them); the names still left."""
        for name, marked in list(self._undeleted.items())[:limit]:
            try:
                if self.api is not None:
                    self.api.delete_pod(name)
            except SandboxError as e:
                if not marked:
                    self._mark_ended(name)
                if name in self._undeleted:  # to the back: the next sweep's ``limit`` reaches the others
                    self._undeleted[name] = self._undeleted.pop(name, marked)
                if e.details.get("status") is None:
                    break  # no answer: the API is down, the rest would only wait as long
                continue
            self._undeleted.pop(name, None)
            log.info("kubernetes: deleted pod %s (an earlier delete had failed)", name)
        return list(self._undeleted)

    def retry_claims(self) -> None:
        """Send again the claims of pooled pods that the API did not take."""
        for name, (inst, patch) in list(self._unclaimed.items()):
            if inst.box.destroyed:
                self._unclaimed.pop(name, None)
                continue
            try:
                self.patch_with_egress(inst, patch)
            except SandboxError as e:
                log.warning("kubernetes: claiming pod %s failed again: %s", name, e.message)
                continue
            self._unclaimed.pop(name, None)
            log.info("kubernetes: claimed pod %s for %s (an earlier claim had failed)", name, inst.instance_id)

    def ensure_agent_configmap(self) -> bool:
        """Create the agent ConfigMap again if it is gone (namespace wiped, operator clean-up); True if so."""
        if self.api is None or self._configmap_body is None:
            return False
        created = self.api.ensure_configmap(self._configmap_body)
        if created:
            log.warning("kubernetes: the agent ConfigMap %s was missing; re-created it",
                        self._configmap_body["metadata"]["name"])
        return created

    # -- the sweep -------------------------------------------------------------------------
    def sweep(self) -> int:
        """Delete this template's ended, expired and stuck pods (any replica's); mark lost local boxes dead."""
        if self.api is None:
            return 0
        self.retry_deletes(RETRIES_PER_SWEEP)
        self.retry_claims()
        try:
            self.ensure_agent_configmap()
        except SandboxError as e:
            log.warning("kubernetes: checking the agent ConfigMap failed: %s", e.message)
        # Boxes first, pods second: a box registered after the listing must not look deleted.
        with self._lock:
            held = {i.box.name: i for i in self._instances.values()
                    if isinstance(i.box, PodBox) and not i.box.destroyed}
            boxes = [i.box for i in self._instances.values()]
        for pool in (self._pool, *self._named_pools.values()):  # pooled ones: discarded at take, then replaced
            boxes += list(getattr(pool, "_ready", ()))
        labels = {t.name for t in self.templates.values()}
        pods = [p for p in self.api.list_pods("app.kubernetes.io/managed-by=execbox")
                if (p.metadata.labels or {}).get(ks.L_TEMPLATE) in labels]
        now = time.time()
        seen: dict[str, Any] = {p.metadata.name: p for p in pods}
        for box in boxes:
            if isinstance(box, PodBox) and not box.destroyed:
                pod = seen.get(box.name)
                reason = "pod deleted" if pod is None else pod_failure(pod)
                if reason and box.pod_status in (None, "pod deleted"):
                    box.pod_status = reason  # kept for the error the box's caller gets
                    box.client.dead = box.client.dead or reason
        removed = 0
        failed_since = {}
        ready_timeout = float(self.config["ready_timeout"])
        for pod in pods:
            ann, name = pod.metadata.annotations or {}, pod.metadata.name
            failure = pod_failure(pod)
            if failure:  # ended pods stay a moment, so whoever waits on one can still read why it ended
                failed_since[name] = self._failed_since.get(name, now)
                failure = failure if now - failed_since[name] >= self.failed_grace else None
            expires = float(ann.get(ks.A_EXPIRES) or 0)
            if marked_ended(pod):
                expires = 1.0  # a gone session's pod whose delete failed: expired now
            created = pod.metadata.creation_timestamp.timestamp() if pod.metadata.creation_timestamp else now
            # Stuck: not Ready well after its creator gave up on it (its own ready-by, else ours). Not
            # a session pod marked with its registry: it was Ready once (marked after its row was
            # written), so not being Ready now is a hiccup or a death that its owner's next use, a
            # take-over's re-attach (which gives up after ready_timeout) or the session's own end
            # settles; deleting it here would cut a live session another replica serves.
            ready_by = float(ann.get(ks.A_READY_BY) or 0) or created + ready_timeout
            stuck = not pod_ready(pod) and now > ready_by + ready_timeout and ks.A_REGISTRY not in ann
            if not failure and name in held:
                if (expires and now > expires) or stuck:  # our live session's pod: its claim did not land
                    log.warning("kubernetes: pod %s of live instance %s looks %s; not deleting it", name,
                                held[name].instance_id, "stuck" if stuck else "expired")
                continue
            if failure or (expires and now > expires) or stuck:
                if self.api.delete_pod(name):
                    removed += 1
                    log.info("kubernetes: swept pod %s (%s)", name,
                             failure or ("stuck before ready" if stuck else "expired"))
        self._failed_since = failed_since
        return removed

    def _sweep_loop(self) -> None:
        while not self._stop.wait(float(self.config["sweep_interval"])):
            try:
                self.sweep()
            except SandboxError as e:
                log.warning("kubernetes: sweep failed: %s", e.message)
            except Exception:  # noqa: BLE001 - the sweeper must survive anything
                log.exception("kubernetes: sweep failed")
