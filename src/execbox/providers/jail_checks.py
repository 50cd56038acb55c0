"""Host prerequisites of the jail provider that `execbox doctor` reports (providers/jail.py
``diagnose``): the box uid range, user namespaces, and a trivial box really started."""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

from ..boxes import bwrap, uids
from ..errors import SandboxError


def uid_range_check() -> dict[str, Any]:
    """Boxes run as one host uid each from the configured range (root only); no real user in it."""
    if os.geteuid() != 0:
        return {"ok": True, "detail": f"boxes run as the service uid {os.geteuid()} (per-box uids need root)"}
    rng = uids.configured_range()
    users = uids.users_in_range(rng)
    if users:
        return {"ok": False, "detail": f"EXECBOX_JAIL_UID_RANGE {rng.describe()} holds real users: "
                                       f"{', '.join(users)}; pick a range no account uses"}
    return {"ok": True, "detail": f"one host uid per box from {rng.describe()}"}


def userns_check() -> dict[str, Any]:
    try:
        with open("/proc/sys/user/max_user_namespaces", encoding="ascii") as f:
            n = int(f.read())
    except (OSError, ValueError):
        n = -1
    if n == 0:
        return {"ok": False, "detail": "user namespaces disabled (sysctl user.max_user_namespaces=0)"}
    try:
        with open("/proc/sys/kernel/unprivileged_userns_clone", encoding="ascii") as f:
            if f.read().strip() == "0":
                return {"ok": False, "detail": "unprivileged user namespaces disabled "
                                               "(sysctl kernel.unprivileged_userns_clone=0)"}
    except OSError:
        pass
    return {"ok": True, "detail": f"max_user_namespaces={n}"}


def trial_box(path: str) -> dict[str, Any]:
    """Really start a trivial box (same namespaces and uid drop as a real one)."""
    argv = [path, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--cap-drop", "ALL", "--uid", str(bwrap.BOX_UID), "--gid", str(bwrap.BOX_GID),
            *bwrap.system_mounts(), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--clearenv",
            "--", "/usr/bin/true"]
    try:
        lease = uids.acquire() if os.geteuid() == 0 else None  # a uid no live box holds
    except SandboxError as e:
        return {"ok": False, "detail": e.message}
    uid = lease.uid if lease is not None else None

    def drop() -> None:
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)

    t = time.monotonic()
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20,  # noqa: S603
                              preexec_fn=drop, env={"PATH": "/usr/bin:/bin"}, cwd="/", text=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"ok": False, "detail": f"bwrap could not start: {e}"}
    finally:
        if lease is not None:
            lease.release()
    if proc.returncode != 0:
        return {"ok": False, "detail": f"bwrap failed (exit {proc.returncode}): {proc.stdout.strip()[-300:]}"}
    return {"ok": True, "detail": f"a trivial box ran in {(time.monotonic() - t) * 1000:.0f} ms"}
