"""What the Docker provider leaves behind, and what dead execbox processes left: containers, old
volumes, and the host side of their boxes (boxes/docker_host.py: workspace mounts, uid pins).
Split from providers/docker.py, which keeps the pool and box lifecycle.
"""

from __future__ import annotations

import logging
from typing import Any

from ..boxes import docker_host
from ..boxes.docker_box import remove_volume
from ..boxes.docker_owner import OWNER_LABEL, labelled_resources, remove_all, remove_stale

log = logging.getLogger("execbox.provider.docker")

PROVIDER_LABEL = "execbox.provider_uid"  # one provider object: its shutdown sweeps only its own


class DockerHygieneMixin:
    docker: Any
    owner: str
    uid: str
    _kept: set[str]

    def owned_resources(self, mine: bool = False) -> tuple[list[Any], list[Any]]:
        """(containers, volumes) labelled by execbox; only this provider object's when ``mine``."""
        return labelled_resources(self.docker, f"{PROVIDER_LABEL}={self.uid}" if mine else OWNER_LABEL)

    def remove_stale(self) -> int:
        """Remove containers and volumes whose owning execbox process no longer exists, then the
        host dirs and uid pins no container needs any more (boxes/docker_host.sweep)."""
        removed = remove_stale(self.docker, self.owner)
        try:
            docker_host.sweep(self.docker, getattr(self, "engine_id", "") or None)  # this engine's only
        except Exception as e:  # noqa: BLE001 - leftovers only cost disk and uids
            log.warning("docker: sweeping host dirs of dead boxes failed: %s", e)
        return removed

    def remove_leftovers(self) -> None:
        """At shutdown, after every box was destroyed: containers of ours still there (not the
        sessions kept running), with their host side, and volumes an older execbox made."""
        try:
            containers, volumes = self.owned_resources(mine=True)
            for c in containers:
                if c.id not in self._kept and remove_all([c]):
                    docker_host.release_removed(c.labels or {})
            for v in volumes:
                remove_volume(self.docker.api, v.name)
        except Exception as e:  # noqa: BLE001
            log.warning("docker: final cleanup failed: %s", e)
