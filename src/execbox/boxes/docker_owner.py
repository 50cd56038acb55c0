"""Owner labels on containers and volumes, so a restarted service finds what a dead execbox left.

An owner is ``host:pid:start-time``; a resource whose owner process is gone (and that no session
registry claims) is stale and removed at start-up.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from typing import Any

log = logging.getLogger("execbox.docker")

OWNER_LABEL = "execbox.owner"
REGISTRY_LABEL = "execbox.registry"
"""Set on a session's container when a persistent session registry tracks it (value: the
workspaces root that registry's sessions live under); such a container survives a restart."""


def _proc_start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_id(pid: int | None = None) -> str:
    """``host:pid:start-time``: identifies this process, robust against pid reuse."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_proc_start_time(pid)}"


def owner_is_gone(owner: str) -> bool:
    """True when ``owner`` names a process on this host that no longer exists."""
    try:
        host, pid, start = owner.rsplit(":", 2)
    except ValueError:
        return False
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return _proc_start_time(int(pid)) != start


def labelled_resources(client: Any, label_filter: str) -> tuple[list[Any], list[Any]]:
    """(containers incl. stopped, volumes) matching a Docker label filter."""
    return (client.containers.list(all=True, filters={"label": label_filter}, ignore_removed=True),
            client.volumes.list(filters={"label": label_filter}))


def remove_all(objects: list[Any]) -> int:
    removed = 0
    for obj in objects:
        try:
            obj.remove(force=True)
            removed += 1
        except Exception as e:  # noqa: BLE001 - gone already, or in use for a moment
            log.warning("removing %s failed: %s", getattr(obj, "name", obj), e)
    return removed


def remove_stale(client: Any, me: str) -> int:
    """Remove containers, then volumes, labelled by an execbox process that no longer exists."""
    containers, volumes = labelled_resources(client, OWNER_LABEL)

    def stale(labels: dict[str, str] | None) -> bool:
        owner = (labels or {}).get(OWNER_LABEL, "")
        if (labels or {}).get(REGISTRY_LABEL):
            return False  # a registered session's box outlives its process: the registry decides
        return bool(owner) and owner != me and owner_is_gone(owner)

    removed = remove_all([c for c in containers if stale(c.labels)])
    removed += remove_all([v for v in volumes if stale(v.attrs.get("Labels"))])
    if removed:
        log.info("docker: removed %d stale containers/volumes of dead execbox processes", removed)
    return removed


def safe_name(*parts: str) -> str:
    """A container/volume name from free-form ids: [a-zA-Z0-9_.-] only, bounded length."""
    text = "-".join(re.sub(r"[^a-zA-Z0-9_.-]", "_", p)[:40] for p in parts if p)
    return text[:120]
