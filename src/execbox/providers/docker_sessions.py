"""What the session registry needs from the Docker provider to keep sessions across restarts.

A session's container is labelled ``execbox.registry=<workspaces root>``; on SIGTERM the
service *detaches* from it (closes its attach stream, leaves it running) instead of removing
it, and the next start *re-attaches* (``reattach_container``) with the agent's contexts intact.
Containers so labelled that no registry row refers to are removed at start.
"""

from __future__ import annotations

import logging
from typing import Any

from ..boxes.docker_box import reattach_container, try_remove_container
from ..boxes.docker_host import release_removed
from ..boxes.docker_owner import REGISTRY_LABEL
from ..boxes.docker_removals import Removals, engine_unreachable
from ..models import SandboxInstance, make_instance_id
from .agent_backed import Instance

log = logging.getLogger("execbox.docker")


class DockerSessionsMixin:
    docker: Any
    _kept: set[str]
    _removals: Removals | None

    def adopt_instance(self, handle: dict[str, Any], *, tenant_id: str, session_id: str,
                       workspace: str | None) -> SandboxInstance | None:
        """Re-attach to the session's running container; None when it is gone or not running."""
        self._require_initialized()  # type: ignore[attr-defined]
        container = str(handle.get("container_id") or "")
        if not container:
            return None
        try:
            box = reattach_container(self.docker, container, workspace)
        except Exception as e:  # noqa: BLE001 - removed, stopped, or its agent does not answer
            log.info("docker: cannot re-attach %s: %s", container, e)
            self.remove_box(handle)
            return None
        box.remover = self._remove_later  # type: ignore[attr-defined]
        box.removals = self._removals
        self._kept.discard(box.container_id)
        instance_id = str(handle.get("instance_id") or make_instance_id(tenant_id, session_id))
        inst = Instance(instance_id, box, tenant_id, session_id)
        return self._register(inst, workspace is not None)  # type: ignore[attr-defined]

    def detach_instance(self, instance_id: str) -> bool:
        """Leave a session's container running for the next start (False: not ours to keep)."""
        with self._lock:  # type: ignore[attr-defined]
            inst = self._instances.get(instance_id)  # type: ignore[attr-defined]
            if inst is None or not inst.box.spec.labels.get(REGISTRY_LABEL) or not inst.box.alive():
                return False
            del self._instances[instance_id]  # type: ignore[attr-defined]
        inst.box.destroyed = True  # no teardown: only our end of the stream goes
        inst.box.client.close()
        inst.box.host.detach()  # its uid stays pinned, its workspace mounted, for the next start
        self._kept.add(inst.box.container_id)
        return True

    def remove_box(self, handle: dict[str, Any]) -> None:
        """Remove a session's container by id, then its host side (workspace mounts, uid pin); a
        removal the engine refuses now (it is down) is retried (boxes/docker_removals.py)."""
        container = str(handle.get("container_id") or "")
        if not container:
            return
        api = self.docker.api
        found: list[dict[str, str]] = []

        def attempt() -> None:
            if not found:
                try:
                    found.append((api.inspect_container(container).get("Config") or {}).get("Labels") or {})
                except Exception as e:  # noqa: BLE001 - gone already: its host side was swept or released
                    if engine_unreachable(e):
                        raise
                    found.append({})
            failed = try_remove_container(api, container, container[:12])
            if failed is not None:
                raise failed
            release_removed(found[0])

        if self._removals is None:
            try:
                attempt()
            except Exception:  # noqa: BLE001 - logged
                pass
            return
        self._removals.add(container, attempt, handle.get("workspace"), container[:12], background=False)

    def remove_orphans(self, keep: set[str], registry: str) -> int:
        """Remove session containers of this registry that no registry row refers to."""
        removed = 0
        for c in self.docker.containers.list(all=True, filters={"label": f"{REGISTRY_LABEL}={registry}"}):
            if any(c.id.startswith(k) for k in keep if k):
                continue
            log.info("docker: removing container %s: no session in the registry", c.name)
            self.remove_box({"container_id": c.id})
            removed += 1
        return removed
