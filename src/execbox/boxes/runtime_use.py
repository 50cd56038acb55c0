"""Which running boxes mount a runtime template version (``execbox runtime rm`` refuses those).

A jail box binds its version read-only at ``/opt/execbox/runtime``; a bind mount has the same
device and inode as its source directory. So a box uses a version when, seen through the root of
one of its processes (``/proc/<pid>/root``), that mount point is that directory. This finds the
boxes of every execbox process on the host (the service, a CLI run, tests), holds no state, and
stops counting a box the moment its processes are gone. Processes we may not inspect are skipped.
"""

from __future__ import annotations

import os

from .runtime import RUNTIME_MOUNT


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def boxes_using(dirs: list[str], proc: str = "/proc") -> list[int]:
    """Host pids (one per box) whose ``/opt/execbox/runtime`` is one of ``dirs``."""
    wanted = {ident for ident in map(_identity, dirs) if ident is not None}
    if not wanted:
        return []
    found: dict[str, int] = {}  # mount namespace -> first pid seen in it
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            # lstat: the mount point itself; a symlink planted there (a box without a template
            # runtime could make one) is not followed to some other version
            st = os.lstat(f"{proc}/{name}/root{RUNTIME_MOUNT}")
            if (st.st_dev, st.st_ino) not in wanted:
                continue
            ns = os.readlink(f"{proc}/{name}/ns/mnt")
        except OSError:  # gone, not ours to inspect, or no runtime mounted
            continue
        found.setdefault(ns, int(name))
    return sorted(found.values())
