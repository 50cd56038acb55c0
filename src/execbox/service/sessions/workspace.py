"""Session names and workspace directories: <root>/<tenant>/<session> on the host.

Tenant and session ids become directory names, so they are checked here once; a workspace is
only deleted after its box's teardown has released (unmounted) it.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Callable

from ...errors import InvalidConfigError

log = logging.getLogger("execbox.service.sessions")

NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)
MOUNT_WAIT_SECONDS = 30.0


def check_name(value: str, field_name: str) -> str:
    """Tenant and session ids become directory names: a strict charset, no '.', '..' or '/'."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise InvalidConfigError(
            f"{field_name} must be 1-64 characters of letters, digits, '_', '.', '-' (not starting with '.' "
            "or '-')", details={"field": field_name})
    return value


def mounted(path: str) -> bool:
    """Whether something is mounted on ``path`` (a backend may bind a box's workspace there)."""
    real = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and fields[4].replace("\\040", " ") == real:
                    return True
    except OSError:
        return False
    return False


def remove_workspace(path: str, proceed: Callable[[], bool] | None = None) -> bool:
    """Delete a session workspace once its box's teardown has released it; True when deleted.

    Backends may finish tearing a box down in the background (the jail unmounts the workspace
    image after the kill); deleting under a live mount would only empty the mounted view.
    ``proceed`` is asked once the mount is gone, right before deleting: False leaves the
    workspace (a destroy that is no longer this replica's: another one finishes it).
    """
    deadline = time.monotonic() + MOUNT_WAIT_SECONDS
    while mounted(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    if mounted(path):
        log.error("workspace %s is still mounted after %ss; leaving it", path, MOUNT_WAIT_SECONDS)
        return False
    if proceed is not None and not proceed():
        log.warning("leaving workspace %s: its destroy is no longer this replica's", path)
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def make_workspace_dirs(root: str, tenant_id: str, path: str, base: str | None = None) -> None:
    """base/root/tenant are 0711 (a box's uid may traverse, never list); the session dir is the box's."""
    tenant_dir = os.path.join(root, tenant_id)
    for d in (base or root, root, tenant_dir):
        if not os.path.isdir(d):
            os.makedirs(d, exist_ok=True)
            os.chmod(d, 0o711)
    os.makedirs(path, mode=0o700, exist_ok=True)


def workspace_dirs(root: str) -> list[tuple[str, str, str]]:
    """(tenant, session, path) of every workspace directory on disk under ``root``."""
    out: list[tuple[str, str, str]] = []
    try:
        tenants = os.listdir(root)
    except OSError:
        return out
    for tenant in tenants:
        tdir = os.path.join(root, tenant)
        if not _NAME.fullmatch(tenant) or not os.path.isdir(tdir):
            continue
        for session in os.listdir(tdir):
            path = os.path.join(tdir, session)
            if _NAME.fullmatch(session) and os.path.isdir(path):
                out.append((tenant, session, path))
    return out
