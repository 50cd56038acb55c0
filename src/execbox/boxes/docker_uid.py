"""A host uid of its own for every Docker box, leased from the jail's range (boxes/uids.py).

Why: user code, the agent's spare and its contexts all ran as uid 1000 in every container. Without
a user namespace that is host uid 1000, a login account on many hosts: a plain host process of
that uid could reach every box's files through ``/proc/<pid>/root``, read a box's environ and
memory and ptrace code into a pooled box's spare before hand-out, and all boxes shared that uid's
kernel quotas (one tenant holding every inotify instance starved the others). Now each box runs
as a uid no other live box (jail or Docker, of any execbox process on this host) holds.

Lifetime: the uid is leased before the container is created and *pinned* (``uids.pin``), so it
stays out of circulation while the container runs even after this process dies; the container
carries it as the label ``execbox.run_as``, so a restarted service takes the lease over when it
re-attaches (``take_over``). It is released, and unpinned, only once the container is gone.
Only as root: an unprivileged service cannot chown workspaces to other uids, so its boxes keep
running as ``SANDBOX_UID`` (1000) as before (docs/docker.md says so).

The uid has no entry in the image's passwd: each box gets ``/etc/passwd`` and ``/etc/group`` of
its own (read-only binds) naming it ``sandbox`` with HOME ``/workspace``, so ``whoami``,
``getpass.getuser()`` and node's ``os.userInfo()`` keep working.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any

from ..errors import InstanceCreationError, SandboxError
from . import uids
from .images import SANDBOX_UID, WORKSPACE

log = logging.getLogger("execbox.docker")

RUN_AS_LABEL = "execbox.run_as"
HOST_DIR_LABEL = "execbox.host_dir"  # docker_host.HOST_DIR_LABEL (that module imports this one)
PIN_NOTE = "docker:"
ENGINE_NOTE = " engine="
"""A pin's note is ``docker:<host dir name>`` plus `` engine=<engine ID>`` (docker_host.py says why)."""


def per_box_uids() -> bool:
    """True when boxes get a uid each (execbox runs as root)."""
    return os.geteuid() == 0


def clean_engine(engine: str) -> str:
    """An engine ID as notes hold it: one word."""
    return "".join(engine.split())


def engine_key(info: dict[str, Any]) -> str:
    """Which engine on this host a ``docker info`` describes: its ``ID`` with its data root.

    Not the ID alone: dockerd 20.10 derives it from the host's ``/etc/docker/key.json``, so every
    engine on a host had the same one (seen here); two engines never share a data root. ""
    when the engine says neither."""
    ident, root = str(info.get("ID") or ""), str(info.get("DockerRootDir") or "")
    if not ident and not root:
        return ""
    return hashlib.sha256(f"{ident}\0{root}".encode()).hexdigest()[:16]


def client_engine(client: Any) -> str:
    """``engine_key`` of the engine ``client`` talks to; "" when it does not answer."""
    try:
        return engine_key(client.info() or {})
    except Exception:  # noqa: BLE001 - unknown: only entries that name no engine are judged then
        return ""


def pin_text(name: str, engine: str = "") -> str:
    """The note of the pin of a box with host dir ``name`` on engine ``engine``."""
    engine = clean_engine(engine)
    return PIN_NOTE + name + (ENGINE_NOTE + engine if engine else "")


def parse_note(note: str) -> tuple[str, str | None]:
    """(host dir name, engine ID or None) of a docker pin's note."""
    body = note[len(PIN_NOTE):] if note.startswith(PIN_NOTE) else note
    name, _, engine = body.partition(ENGINE_NOTE)
    return name.strip(), (engine.strip() or None)


def lease(name: str, engine: str = "") -> uids.UidLease | None:
    """A pinned uid for a new box (None when not root: it runs as SANDBOX_UID). SB008 when the
    range is used up."""
    if not per_box_uids():
        return None
    held = uids.acquire()
    try:
        uids.pin(held, pin_text(name, engine))
    except BaseException:
        held.release()
        raise
    return held


def uid_of(held: uids.UidLease | None) -> int:
    return held.uid if held is not None else SANDBOX_UID


def release(held: uids.UidLease | None) -> None:
    """The box's container is gone: its uid may serve the next box."""
    if held is None or not held.held:
        return
    uids.unpin(held)
    held.release()


def take_over(labels: dict[str, str]) -> uids.UidLease | None:
    """The lease of a container another (dead) execbox process started, from its label.

    Refused (SB004) for a container without one while root (it predates per-box uids and runs
    its code as uid 1000) and for a uid some live process holds: the session gets a fresh box.
    """
    raw = labels.get(RUN_AS_LABEL, "")
    if not per_box_uids():
        return None
    if not raw.isdigit():
        raise InstanceCreationError("container has no per-box uid (started before execbox leased one per "
                                    "box); not re-attaching it", details={"label": RUN_AS_LABEL})
    held = uids.try_acquire(int(raw))
    if held is None:
        raise InstanceCreationError(f"host uid {raw} of this container is leased by a live process; "
                                    "not re-attaching it", details={"uid": int(raw)})
    return held


def release_label(labels: dict[str, str]) -> None:
    """Unpin the uid of a container removed by id (no lease object here), unless a live process
    holds it or the pin is another box's.

    Another box's: pins live on tmpfs (``uids.HOST_LOCK_DIR``) and go with a reboot, while a
    stopped container and its label stay until removed, so after a reboot its uid may have gone
    to a new box that pinned it (note ``docker:<host dir name>``, as ``lease`` writes)."""
    raw = labels.get(RUN_AS_LABEL, "")
    if not per_box_uids() or not raw.isdigit():
        return
    held = uids.try_acquire(int(raw))
    if held is None:
        return
    note = uids.pin_note(held.uid)
    if note is not None and (not note.startswith(PIN_NOTE)
                             or parse_note(note)[0] != os.path.basename(labels.get(HOST_DIR_LABEL, ""))):
        held.release()  # a newer box's pin: it keeps the uid
        return
    release(held)


def sweep_pins(client: Any, engine: str | None = None) -> list[int]:
    """Unpin uids whose Docker box is gone and that no live process holds (a crash between the
    lease and the container, a container removed behind execbox's back). Only pins of this engine
    (``engine``: its ID, asked when None) and pins that name none: another engine's containers
    are not in this one's list. Returns those uids."""
    if not per_box_uids():
        return []
    if engine is None:
        engine = client_engine(client)
    live = set()
    for c in client.containers.list(all=True, filters={"label": RUN_AS_LABEL}, ignore_removed=True):
        live.add((c.labels or {}).get(RUN_AS_LABEL, ""))
    freed = []
    for uid in uids.pinned():
        if str(uid) in live or not _pinned_by_docker(uid, engine):
            continue
        held = uids.try_acquire(uid)
        if held is None:
            continue
        release(held)
        freed.append(uid)
    if freed:
        log.info("docker: unpinned %d host uids whose boxes are gone", len(freed))
    return freed


def _pinned_by_docker(uid: int, engine: str | None = None) -> bool:
    """A Docker box's pin (with ``engine``: of that engine's, or of no engine's)."""
    try:
        note = uids.pin_note(uid)
    except OSError:
        return False
    if note is None or not note.startswith(PIN_NOTE):
        return False
    owner = parse_note(note)[1]
    return engine is None or owner is None or owner == clean_engine(engine)


def write_nss(directory: str, uid: int) -> dict[str, str]:
    """passwd and group naming ``uid`` sandbox, in ``directory``; returns {container path: file}."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    files = {
        "/etc/passwd": ("root:x:0:0:root:/root:/bin/sh\n"
                        f"sandbox:x:{uid}:{uid}:execbox sandbox:{WORKSPACE}:/bin/bash\n"
                        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"),
        "/etc/group": f"root:x:0:\nsandbox:x:{uid}:\nnogroup:x:65534:\n",
    }
    out = {}
    for target, text in files.items():
        path = os.path.join(directory, os.path.basename(target))
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(path, 0o644)
        out[target] = path
    return out


def uid_check() -> dict[str, Any]:
    """``execbox doctor``'s view: which host uids boxes run as, and whether a real account has one."""
    if not per_box_uids():
        users = uids.users_in_range(uids.UidRange(SANDBOX_UID, 1))
        if users:
            return {"ok": False, "detail": f"not root: every box runs its code as uid {SANDBOX_UID}, which is the host "
                                           f"account {users[0]}: that account's processes can read and trace boxes; "
                                           "run the service as root (one uid per box) or free that uid"}
        return {"ok": True, "detail": f"not root: every box runs as uid {SANDBOX_UID} (one uid per box needs root)"}
    try:
        rng = uids.configured_range()
    except SandboxError as e:
        return {"ok": False, "detail": e.message}
    users = uids.users_in_range(rng)
    if users:
        return {"ok": False, "detail": f"EXECBOX_JAIL_UID_RANGE {rng.describe()} holds real users: "
                                       f"{', '.join(users)}; pick a range no account uses"}
    return {"ok": True, "detail": f"one host uid per box from {rng.describe()} (shared with the jail)"}
