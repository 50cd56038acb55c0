"""The host side of a Docker box: its own uid (boxes/docker_uid.py), a /workspace of bounded size,
and the host dir holding them; all undone only once the container is gone.

/workspace has the jail's size limit (``disk_quota_mb``, default 512), so a box cannot fill the
host's disk under /var/lib/docker; a write past it fails with ENOSPC inside the box:

* as root with loop devices: an ext4 image (the jail's ``quota.Workspace``): a fresh one in the
  host dir for a box without a session dir (deleted with the box), or the session's persistent
  ``<dir>/.execbox-workspace.img``, also bound onto the session dir so the host sees the files
  in place, and re-owned to each new box's uid when it attaches;
* otherwise a tmpfs of that size, mounted by Docker (it counts against ``max_memory``), and a
  session dir bound as it is, without a limit, as the jail does without root.

Under runc (``ptys``), as root, the host dir also holds the box's own devpts instance, capped at
``devpts.PTYS_PER_BOX`` ptys (boxes/devpts.py), which the container binds over its /dev/pts:
runc's own instance has no cap, so one box could take every pty the host has left.

The host dir ``<jail dir>/docker-boxes/docker-<pid>-<id>`` (root only) holds the mount points, the
fresh image and the box's passwd/group; the container carries its path as the label
``execbox.host_dir``, so a restarted service, or the sweep of a dead one's leftovers, can undo it.
The engine must see this process's mounts (dockerd in the host's mount namespace, the default).

Several engines on one host share the host dirs and uid pins (they are host-wide), but each sweep
asks only its own engine which containers still need them: so the host dir names its engine
(file ``engine``: ``docker_uid.engine_key``, a hash of the engine's ID and data root; the uid's pin
names it too), and a sweep leaves another engine's entries alone (review 40: a service on a second
engine unmounted a live session's workspace and unpinned its uid). Entries that name no engine
(made before this) are judged as before, by this engine alone.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from typing import Any

from . import devpts, docker_uid, quota, uids
from .images import SANDBOX_UID
from .runtime import jail_dir

log = logging.getLogger("execbox.docker")

HOST_DIR_LABEL = "execbox.host_dir"
PREFIX = "docker-"
ENGINE_FILE = "engine"


def boxes_root() -> str:
    return os.path.join(jail_dir(), "docker-boxes")


class HostSide:
    """What one Docker box holds on the host: uid lease, workspace mounts, host dir."""

    def __init__(self, caller_dir: str | None, lease: uids.UidLease | None, host_dir: str | None = None,
                 ws: quota.Workspace | None = None, bind: str | None = None, tmpfs_bytes: int = 0) -> None:
        self.caller_dir = caller_dir
        self.lease = lease
        self.uid = docker_uid.uid_of(lease)
        self.host_dir = host_dir
        self.ws = ws
        self.bind = bind  # what the container binds on /workspace (None: a tmpfs of tmpfs_bytes)
        self.tmpfs_bytes = tmpfs_bytes
        self.nss: dict[str, str] = {}  # container path -> host file, bound read-only
        self.pts: str | None = None  # the box's capped devpts on the host, bound on /dev/pts (runc)

    @classmethod
    def prepare(cls, caller_dir: str | None, size_bytes: int, ptys: bool = False, engine: str = "") -> HostSide:
        """Lease a uid and set up /workspace for a new box (nothing is left behind on failure);
        with ``ptys`` (a runtime on the host's kernel: runc) also mount the box's capped devpts.
        ``engine``: which Docker engine the box's container runs on (``engine_id``)."""
        if caller_dir is not None:
            os.makedirs(caller_dir, exist_ok=True)
        if not docker_uid.per_box_uids():
            if caller_dir is None:
                return cls(None, None, tmpfs_bytes=size_bytes)
            os.chown(caller_dir, SANDBOX_UID, SANDBOX_UID)
            return cls(caller_dir, None, bind=caller_dir)
        if caller_dir is not None:
            wait_unmounted(caller_dir)
        host_dir = os.path.join(boxes_root(), f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}")
        os.makedirs(host_dir, mode=0o755)
        lease: uids.UidLease | None = None
        ws = quota.Workspace(host_dir, caller_dir)
        engine = docker_uid.clean_engine(engine)
        try:
            if engine:
                with open(os.path.join(host_dir, ENGINE_FILE), "w", encoding="utf-8") as f:
                    f.write(engine)
            lease = docker_uid.lease(os.path.basename(host_dir), engine)
            assert lease is not None
            side = cls(caller_dir, lease, host_dir, ws)
            side.nss = docker_uid.write_nss(host_dir, lease.uid)
            if ptys:
                side.pts = devpts.mount(host_dir, lease.uid)  # None where root may not mount: runc's own
            ws.setup(size_bytes, lease.uid)
            side.bind = ws.bind_src
            if side.bind is None:  # no loop devices here: a tmpfs of the quota
                side.tmpfs_bytes = size_bytes
            elif not ws.loop:  # a session dir bound as it is: re-own it for this box's uid
                chown_tree(side.bind, lease.uid)
            return side
        except BaseException:
            ws.teardown()
            undo(host_dir)
            docker_uid.release(lease)
            raise

    @classmethod
    def reopen(cls, labels: dict[str, str], caller_dir: str | None) -> HostSide:
        """The host side of a container a dead execbox process started (see docker_uid.take_over)."""
        lease = docker_uid.take_over(labels)
        return cls(caller_dir, lease, checked_host_dir(labels.get(HOST_DIR_LABEL, "")), bind=caller_dir)

    def labels(self) -> dict[str, str]:
        if self.lease is None or self.host_dir is None:
            return {}
        return {docker_uid.RUN_AS_LABEL: str(self.uid), HOST_DIR_LABEL: self.host_dir}

    def release(self) -> None:
        """The container is gone: unmount and delete what the box had here, then free its uid
        (kept leased if the teardown left anything: files of that uid may still be mounted)."""
        from .jail_box import remove_box_dir

        try:
            if self.host_dir is not None:
                devpts.unmount(self.host_dir)  # the container (its only user) is gone
            if self.ws is not None:
                self.ws.teardown()  # a session's image stays in its dir; a fresh one goes
                if self.host_dir is not None:
                    remove_box_dir(self.host_dir)
            elif self.host_dir is not None:
                undo(self.host_dir)
        except Exception as e:  # noqa: BLE001 - a background removal: log, keep the uid
            log.error("docker: tearing down %s failed: %s", self.host_dir, e)
        if self.host_dir is not None and os.path.exists(self.host_dir):
            log.error("docker: %s could not be removed; keeping uid %d leased", self.host_dir, self.uid)
            return
        docker_uid.release(self.lease)
        self.lease = None

    def detach(self) -> None:
        """The container stays running without us: let go of the uid's lock, keep its pin and mounts."""
        if self.lease is not None:
            self.lease.release()


HELD_WAIT = 10.0
"""Seconds a new box of a session waits for its previous box to let go of the workspace: its bind
on the session dir, and the loop device of the workspace image (a lazy unmount keeps it until the
old box's last process is gone: a runsc gofer can take seconds). Then quota.StillMounted, which the
provider answers with SB009 ``previous_owner_holds_workspace`` and Retry-After (review 52: this
waited the jail's 30 s, ``quota.RELEASE_WAIT_SECONDS``, for the loop device and then failed SB004)."""


def wait_unmounted(caller_dir: str, timeout: float = HELD_WAIT) -> None:
    """Wait for the session's previous box to let go of its workspace: a destroyed box's
    container and mounts go in the background (quota.StillMounted after ``timeout``)."""
    deadline = time.monotonic() + timeout
    image = os.path.join(caller_dir, quota.PERSISTENT_IMAGE)
    while True:
        bound = quota.is_mounted(caller_dir)
        loops = quota.loop_devices(image) if not bound and os.path.lexists(image) else []
        if not bound and not loops:
            return
        if time.monotonic() > deadline:
            log.warning("docker: workspace %s still held after %.0fs: %s", caller_dir, timeout,
                        "bound on the session dir" if bound else f"its image on {', '.join(loops)}")
            raise quota.StillMounted(f"workspace {os.path.basename(caller_dir)} is still mounted by another box")
        time.sleep(0.05)


def chown_tree(root: str, uid: int) -> None:
    """Give a session dir's tree to ``uid``. By directory fds, never following a link: the previous
    box's code may still be running while its container goes, and could swap a dir for a link."""
    for _path, dirnames, filenames, dir_fd in os.fwalk(root):
        for n in (*dirnames, *filenames):
            os.chown(n, uid, uid, dir_fd=dir_fd, follow_symlinks=False)
    os.chown(root, uid, uid, follow_symlinks=False)


def checked_host_dir(path: str) -> str | None:
    """A host dir named by a label, only if it is one of ours (labels are not trusted with paths)."""
    if not path:
        return None
    real = os.path.realpath(path)
    if os.path.dirname(real) != os.path.realpath(boxes_root()) or not os.path.basename(real).startswith(PREFIX):
        log.warning("docker: ignoring host dir label %r: not under %s", path, boxes_root())
        return None
    return real


def undo(host_dir: str) -> None:
    """Unmount and remove a box's host dir whatever state it was left in (idempotent)."""
    from .jail_box import remove_box_dir

    try:
        with open(os.path.join(host_dir, "host_view"), encoding="utf-8") as f:
            view = f.read().strip()
    except OSError:
        view = ""
    devpts.unmount(host_dir)  # a runc box's capped devpts, if it had one
    if view:
        quota.unmount(view)  # the image's bind onto the session dir, then the image itself
    quota.unmount(os.path.join(host_dir, "workspace"))
    if view:
        quota.detach(os.path.join(view, quota.PERSISTENT_IMAGE))
    quota.destroy(os.path.join(host_dir, "workspace.img"), os.path.join(host_dir, "workspace"))
    remove_box_dir(host_dir)


def release_removed(labels: dict[str, str]) -> None:
    """After removing a container by id: undo its host dir and unpin its uid."""
    host_dir = checked_host_dir(labels.get(HOST_DIR_LABEL, ""))
    if host_dir is not None:
        undo(host_dir)
    docker_uid.release_label(labels)


def engine_id(client: Any) -> str:
    """What names the engine in host dirs and pins (``docker_uid.engine_key``; "" if unknown)."""
    return docker_uid.client_engine(client)


def engine_of(host_dir: str) -> str | None:
    """The engine a host dir's box ran on; None for a dir without one (made before engines were noted)."""
    try:
        with open(os.path.join(host_dir, ENGINE_FILE), encoding="utf-8") as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None
    except OSError:
        return ""  # unreadable: not provably ours, so not swept


def sweep(client: Any, engine: str | None = None) -> int:
    """Undo host dirs of dead execbox processes that no container of this engine refers to, then
    unpin uids whose box is gone. Only this engine's entries (``engine``: its ID, asked when None),
    and those that name no engine. Returns how many dirs went."""
    if not docker_uid.per_box_uids():
        return 0
    if engine is None:
        engine = engine_id(client)
    root = boxes_root()
    try:
        names = os.listdir(root)
    except OSError:
        names = []
    referenced = set()
    for c in client.containers.list(all=True, filters={"label": HOST_DIR_LABEL}, ignore_removed=True):
        referenced.add(checked_host_dir((c.labels or {}).get(HOST_DIR_LABEL, "")))
    gone = 0
    for name in names:
        pid = name[len(PREFIX):].split("-", 1)[0]
        path = os.path.join(root, name)
        if not name.startswith(PREFIX) or not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
            continue
        if os.path.realpath(path) in referenced:
            continue
        owner = engine_of(path)
        if owner is not None and owner != engine:
            continue  # another engine's box: only that engine knows whether it still runs
        undo(path)
        gone += 1
    if gone:
        log.info("docker: removed %d host dirs of boxes whose execbox process died", gone)
    docker_uid.sweep_pins(client, engine)
    return gone
