"""Why a container died: its engine state and its memory cgroup's OOM counters.

Kept apart from the box because gVisor and the kernel report an out-of-memory death in
different places (host cgroup counters, the engine's OOMKilled flag, or only a peak at the limit).
"""

from __future__ import annotations

import os
import time
from typing import Any

OOM_SETTLE_SECONDS = 5
"""How long a dead box's container may take to stop before its OOM state is read."""


def exit_state(api: Any, container_id: str) -> str:
    """Why a container stopped, from its state (exit code, OOM, engine error)."""
    try:
        st = api.inspect_container(container_id)["State"]
    except Exception as e:  # noqa: BLE001
        return f"container state unknown ({e})"
    parts = [f"container {st.get('Status')}", f"exit code {st.get('ExitCode')}"]
    if st.get("OOMKilled"):
        parts.append("OOM-killed")
    if st.get("Error"):
        parts.append(f"engine error: {st['Error']}")
    return ", ".join(parts)


def engine_oom(api: Any, container_id: str, since: float, settle: bool) -> bool:
    """Whether the engine saw the container run out of memory: its State.OOMKilled, else an ``oom``
    event. Docker sets OOMKilled only when the shim reports the OOM before the exit; under runsc the
    two race (the sandbox is one host process, killed by that very OOM), and the late report is
    still logged as an event. ``settle``: the box is dead, so first wait for the container to stop."""
    try:
        if settle:
            api.wait(container_id, timeout=OOM_SETTLE_SECONDS)
    except Exception:  # noqa: BLE001 - still running after the wait, or already removed
        pass
    try:
        state = api.inspect_container(container_id)["State"]
    except Exception:  # noqa: BLE001 - already removed: nothing more to learn
        return False
    if state.get("OOMKilled"):
        return True
    if state.get("Running") or state.get("ExitCode") != 137:
        return False  # an OOM kill is a SIGKILL; anything else died otherwise
    try:  # ``until`` a second ahead: the call returns once the engine has passed it (a late event lands)
        events = api.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True,
                            filters={"container": container_id, "event": "oom"})
        return any(ev.get("status") == "oom" or ev.get("Action") == "oom" for ev in events)
    except Exception:  # noqa: BLE001 - an engine that cannot list events gives no verdict
        return False


def oom_file(container_id: str) -> str | None:
    for path in (f"/sys/fs/cgroup/memory/docker/{container_id}/memory.oom_control",
                 f"/sys/fs/cgroup/docker/{container_id}/memory.events",
                 f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/memory.events"):
        if os.path.exists(path):
            return path
    return None


MEMORY_LIMIT_FRACTION = 0.95
"""A dead box whose peak memory reached this share of its limit is counted as out of memory."""


def at_memory_limit(oom_file: str) -> bool:
    """Whether the container's memory cgroup peaked at its limit (v1 and v2 file names)."""
    d = os.path.dirname(oom_file)
    for peak_name, limit_name in (("memory.max_usage_in_bytes", "memory.limit_in_bytes"),
                                  ("memory.peak", "memory.max")):
        try:
            with open(os.path.join(d, peak_name), encoding="ascii") as fh:
                peak = int(fh.read().strip())
            with open(os.path.join(d, limit_name), encoding="ascii") as fh:
                raw = fh.read().strip()
        except (OSError, ValueError):
            continue
        if not raw.isdigit():
            return False  # "max": no limit to reach
        return peak >= int(raw) * MEMORY_LIMIT_FRACTION
    return False
