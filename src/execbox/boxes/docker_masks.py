"""Paths masked in a runc box: Docker's own list plus the host's views of its block devices.

A runc container shares the host kernel's /proc and /sys. Through them code in one box read
``/sys/block/loop*/loop/backing_file``, the path of every other box's workspace image (a session's
is ``<workspaces>/<tenant>/<session>/.execbox-workspace.img``: every live session's tenant and
session id), and the I/O counters of each of those loop devices (``/proc/diskstats``, the ext4
and jbd2 statistics of each mounted image). ``BLOCK_VIEWS`` are masked as Docker masks its own
list: a file under /dev/null, a directory under an empty read-only tmpfs; a path that does not
exist is skipped by runc. ``lsblk``-style tools see no block devices; nothing in a box needs them.

HostConfig ``MaskedPaths`` (API 1.40) *replaces* the daemon's list, so the box's list starts with
what this daemon masks by default (``engine_defaults``: read off a container created, never started,
and removed at once) and everything Docker has masked by default in any release (``DOCKER_DEFAULTS``,
in case that probe fails). gVisor (runsc) serves its own /proc and /sys, where none of these paths
exist: its boxes keep the daemon's list (``masked_paths`` None).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("execbox.docker")

DOCKER_DEFAULTS = (
    "/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
"""moby's ``oci.DefaultSpec`` masked paths (20.10: the first ten less /proc/interrupts; later
releases added /sys/devices/virtual/powercap and /proc/interrupts)."""

BLOCK_VIEWS = (
    "/proc/diskstats", "/proc/partitions", "/sys/block", "/sys/class/block", "/sys/devices/virtual/block",
    "/sys/fs/ext4", "/proc/fs/ext4", "/proc/fs/jbd2", "/sys/class/bdi", "/sys/devices/virtual/bdi",
)
"""The host's block devices as a runc box would see them: loop devices (other boxes' workspace
images, their backing files, sizes and I/O counters). /sys/dev/block's links lead into
/sys/devices/virtual/block, masked here; the bdi views (``7:N``, one per loop device) count the
live workspace images."""


def masked_paths(engine: list[str] | tuple[str, ...] = ()) -> list[str]:
    """What a runc box masks: the engine's defaults, Docker's known ones and ``BLOCK_VIEWS``."""
    return list(dict.fromkeys([*engine, *DOCKER_DEFAULTS, *BLOCK_VIEWS]))


def engine_defaults(client: Any, image: str, labels: dict[str, str]) -> list[str]:
    """The daemon's default MaskedPaths: those of a plain container created (never started) from
    ``image`` and removed at once. [] when that fails (logged; ``DOCKER_DEFAULTS`` then stand in)."""
    api = client.api
    cid = None
    try:
        cid = api.create_container(image, command=["/bin/true"], labels=labels, network_disabled=True,
                                   host_config=api.create_host_config(network_mode="none"))["Id"]
        return list(api.inspect_container(cid)["HostConfig"].get("MaskedPaths") or [])
    except Exception as e:  # noqa: BLE001 - the known defaults stand in
        log.warning("docker: could not read the engine's default masked paths (%s); using Docker's known list", e)
        return []
    finally:
        if cid is not None:
            try:
                api.remove_container(cid, force=True)
            except Exception as e:  # noqa: BLE001 - labelled: removed at shutdown or by the next start
                log.warning("docker: removing the masked-paths probe %s failed: %s", cid[:12], e)
