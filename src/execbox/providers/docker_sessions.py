"""What the session registry needs from the Docker provider to keep sessions across restarts.

A session's container is labelled ``execbox.registry=<workspaces root>``; on SIGTERM the
service *detaches* from it (closes its attach stream, leaves it running) instead of removing
it, and the next start *re-attaches* (``reattach_container``) with the agent's contexts intact.
Containers so labelled that no registry row refers to are removed at start.

The same re-attach serves a box whose stream the *engine* cut: dockerd closes every attach stream
when it stops, and with ``--live-restore`` the containers keep running (``DockerBox.recover``). A
request cut off so is answered SB009 without the box being given up; the box is re-attached once
the engine answers, with its contexts (review 52: it was taken for dead and replaced, contexts
lost, and the replacement waited 30 s for the workspace the live box still held, then SB004).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..boxes import quota
from ..boxes.agent_client import BoxDied
from ..boxes.docker_box import DockerBox, reattach_container, try_remove_container
from ..boxes.docker_host import release_removed
from ..boxes.docker_owner import REGISTRY_LABEL
from ..boxes.docker_recover import GONE, RUNNING
from ..boxes.docker_removals import Removals, engine_unavailable, engine_unreachable
from ..errors import ProviderUnavailableError
from ..models import SandboxInstance, make_instance_id
from .agent_backed import Instance

log = logging.getLogger("execbox.docker")

HELD_RETRY = 1
"""Retry-After (seconds) while a session's previous box still holds its workspace."""
RESTARTED_RETRY = 1
"""Retry-After (seconds) of a request cut off by an engine restart, its box re-attached."""


class DockerSessionsMixin:
    docker: Any
    name: str
    live_restore: bool
    _kept: set[str]
    _pinger: Any
    _removals: Removals | None

    def _recoverable(self, box: Any) -> None:
        """A box handed out: when its stream ends, ask the engine before taking it for dead."""
        if isinstance(box, DockerBox):
            box.recoverable = True
            box.engine_keeps_boxes = self.live_restore
            box.probe_client = self._pinger

    def _get(self, instance_id: str) -> Instance:
        """The instance, its box re-attached first when the engine cut its stream while it was idle
        (so the request runs, rather than failing on the old stream)."""
        inst: Instance = super()._get(instance_id)  # type: ignore[misc]
        box = inst.box
        if isinstance(box, DockerBox) and box.recoverable and not box.destroyed and box.transport.ended():
            box.recover()
        return inst

    def _box_died(self, inst: Instance, err: BoxDied) -> None:
        """A request whose box's stream ended: a container that still runs (the engine cut the
        stream: it restarted with live-restore) is re-attached and kept, and so is one an engine with
        live-restore cannot tell about yet; the request itself gets SB009 either way (its outcome is
        unknown: a run in it was stopped). Only a container that stopped or went is a dead box."""
        box = inst.box
        if isinstance(box, DockerBox) and box.recoverable and not box.destroyed:
            found = box.recover()
            if found == RUNNING:
                e = ProviderUnavailableError(
                    f"{self.name}: the Docker engine cut the connection to the box of instance {inst.instance_id} "
                    "(it restarted) while this request was in it; the box still runs and is re-attached with its "
                    "contexts, but the request's outcome is unknown (a run in it was stopped); retry",
                    details={"reason": "docker_engine_restarted", "instance_id": inst.instance_id,
                             "provider": self.name, "box_died": False, "retry_after": RESTARTED_RETRY})
                e.retry_after = RESTARTED_RETRY  # type: ignore[attr-defined]
                raise e
            if found != GONE:
                e = engine_unavailable(self.name, f" (stopped or restarting; the box of instance {inst.instance_id} is "
                                                  "kept for when it is back, with its contexts; a request cut off with "
                                                  "the engine may or may not have run)")
                e.details.update({"instance_id": inst.instance_id, "box_died": False})
                raise e
        super()._box_died(inst, err)  # type: ignore[misc]

    def _settle_workspace(self, workspace: str) -> None:
        """Before a session's new box: its previous boxes' removals, which hold its workspace, are
        finished now (docker_removals.py). While the engine does not answer, a quick SB009 instead
        of waiting out the mount (docker_host.wait_unmounted)."""
        if self._removals is not None:
            self._removals.settle(workspace, self.name)
        if os.path.exists(workspace) and quota.is_mounted(workspace):
            try:
                self.docker.ping()
            except Exception as e:  # noqa: BLE001
                if engine_unreachable(e):
                    raise engine_unavailable(self.name) from None

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


def workspace_still_held(provider: str, session_id: str | None) -> ProviderUnavailableError:
    """503 SB009 (not SB004: capacity is not the problem) for a session box that could not start
    because the session's previous box still holds its workspace (its container being removed, its
    loop device not released yet): the same answer as a takeover the previous owner's box blocks
    (docs/sessions.md), with Retry-After."""
    err = ProviderUnavailableError(
        f"{provider}: the previous box of session {session_id} still holds its workspace (it is being "
        "removed); retry in a moment",
        details={"reason": "previous_owner_holds_workspace", "provider": provider, "session_id": session_id,
                 "retry_after": HELD_RETRY})
    err.retry_after = HELD_RETRY  # type: ignore[attr-defined]
    return err
