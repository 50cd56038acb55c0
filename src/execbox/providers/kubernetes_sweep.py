"""The pod sweeper: any replica deletes its templates' ended, expired and stuck pods.

Pods carry all their state (labels, annotations), so sweeping needs no coordination between
replicas; a local box whose pod is gone is marked dead with the reason its caller will see.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..boxes import k8s_spec as ks
from ..boxes.k8s_box import PodApi, PodBox, pod_failure, pod_ready
from ..boxes.pool import BoxPool
from ..errors import SandboxError
from .agent_backed import AgentBackedProvider

log = logging.getLogger("execbox.provider.kubernetes")


class PodSweeperMixin(AgentBackedProvider):
    api: PodApi | None
    templates: dict[str, ks.PodTemplate]
    _named_pools: dict[str, BoxPool]
    _failed_since: dict[str, float]
    _stop: threading.Event
    failed_grace: float

    def sweep(self) -> int:
        """Delete this template's ended, expired and stuck pods (any replica's); mark lost local boxes dead."""
        if self.api is None:
            return 0
        # Boxes first, pods second: a box registered after the listing must not look deleted.
        with self._lock:
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
        for pod in pods:
            ann = pod.metadata.annotations or {}
            failure = pod_failure(pod)
            if failure:  # ended pods stay a moment, so whoever waits on one can still read why it ended
                failed_since[pod.metadata.name] = self._failed_since.get(pod.metadata.name, now)
                failure = failure if now - failed_since[pod.metadata.name] >= self.failed_grace else None
            expires = float(ann.get(ks.A_EXPIRES) or 0)
            created = pod.metadata.creation_timestamp.timestamp() if pod.metadata.creation_timestamp else now
            stuck = not pod_ready(pod) and now - created > 2 * float(self.config["ready_timeout"])
            if failure or (expires and now > expires) or stuck:
                if self.api.delete_pod(pod.metadata.name):
                    removed += 1
                    log.info("kubernetes: swept pod %s (%s)", pod.metadata.name,
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
