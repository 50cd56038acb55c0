"""Removing jail boxes' host directories, and the boxes of execbox processes that died (jail_box.py).

A box's host directory is ``<jail dir>/boxes/jail-<owner pid>-...``: its workspace mount point,
its devpts mount and its stderr log. Nothing here follows a mount point: a failed unmount never
deletes a caller's files.
"""

from __future__ import annotations

import logging
import os

from . import cgroups, devpts, quota
from .runtime import jail_dir

log = logging.getLogger("execbox.jail")


def boxes_dir() -> str:
    return os.path.join(jail_dir(), "boxes")


def reap_stale() -> list[str]:
    """Clean up boxes left by execbox processes that died without destroying them.

    A box dir is named ``jail-<owner pid>-...``; if that pid no longer exists its processes,
    cgroup (where this process's layout can see it), mounts (its devpts, its workspace) and files
    are removed.
    """
    reaped: list[str] = []
    root = boxes_dir()
    try:
        names = os.listdir(root)
    except OSError:
        return reaped
    layout = None
    try:
        layout = cgroups.detect()
    except cgroups.CgroupUnavailable:
        pass
    for name in names:
        parts = name.split("-")
        if len(parts) < 4 or parts[0] != "jail" or not parts[1].isdigit():
            continue
        if os.path.exists(f"/proc/{parts[1]}"):
            continue
        if layout is not None:
            cg = cgroups.BoxCgroup(layout, name)
            if cg.exists():
                cg.kill_all()
                cg.remove()
        box_dir = os.path.join(root, name)
        devpts.unmount(box_dir)
        try:
            with open(os.path.join(box_dir, "host_view"), encoding="utf-8") as f:
                quota.unmount(f.read().strip())
        except OSError:
            pass
        ws = os.path.join(box_dir, "workspace")
        quota.unmount(ws)
        for img in ("workspace.img",):
            try:
                os.unlink(os.path.join(box_dir, img))
            except OSError:
                pass
        remove_box_dir(box_dir)
        reaped.append(name)
    return reaped


def remove_box_dir(box_dir: str) -> None:
    """Delete a box's host directory without ever recursing into a mount point.

    Its workspace is a mount point (a quota image or a caller's directory): only an empty,
    unmounted directory is removed, so a failed unmount can never delete a caller's files.
    """
    try:
        names = os.listdir(box_dir)
    except FileNotFoundError:
        return
    for n in names:
        path = os.path.join(box_dir, n)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                if quota.is_mounted(path):
                    log.error("box dir %s: %s is still mounted; leaving it", box_dir, path)
                    continue
                os.rmdir(path)
            else:
                os.unlink(path)
        except OSError as e:
            log.error("box dir %s: cannot remove %s: %s", box_dir, n, e)
    try:
        os.rmdir(box_dir)
    except OSError as e:
        log.error("cannot remove box dir %s: %s", box_dir, e)


