"""Start, kill and clean up one jail box: cgroup + workspace quota + seccomp + bubblewrap.

Start order: create the cgroup and the quota-limited workspace, then fork bwrap from one
long-lived spawner thread (``--die-with-parent`` ties a box to the *thread* that forked it,
so a box started from a short-lived request thread would die with that thread). The forked
child joins the box's cgroup and, when execbox runs as root, drops to an unprivileged host
uid before exec, so even the box's mapped "user" is nobody on the host.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from . import bwrap, cgroups, quota, seccomp
from .box import READY_TIMEOUT, ProcessBox
from .runtime import Runtime, jail_dir

log = logging.getLogger("execbox.jail")

HOST_UID = int(os.environ.get("EXECBOX_JAIL_HOST_UID", "61000"))
"""Host uid/gid boxes run as when execbox is root (no passwd entry needed)."""

_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="execbox-jail-spawn")
_counter = itertools.count(1)


@dataclass
class JailSettings:
    runtime: Runtime
    memory_bytes: int
    cpus: float
    pids: int
    disk_bytes: int
    tmp_bytes: int
    preload: str = "auto"
    use_cgroups: bool = True
    drop_uid: bool = True
    agent_root: str = ""
    etc_dir: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def boxes_dir() -> str:
    return os.path.join(jail_dir(), "boxes")


class JailBox(ProcessBox):
    isolation = "jail"

    def __init__(self, name: str, proc: subprocess.Popen, workspace: str | None, limits: dict[str, Any],
                 cgroup: cgroups.BoxCgroup | None, box_dir: str, quota_image: str | None,
                 bound: str | None = None) -> None:
        super().__init__(name, proc, workspace, limits)
        self.cgroup = cgroup
        self.box_dir = box_dir
        self.quota_image = quota_image
        self.bound = bound  # host bind mount of a caller's workspace inside box_dir
        self.started_at = time.time()
        self.survivors: list[int] = []

    def oom_events(self) -> int:
        return self.cgroup.oom_kills() if self.cgroup else 0

    def kill(self) -> None:
        if self.cgroup is not None:
            self.survivors = self.cgroup.kill_all()
            if self.survivors:
                log.error("box %s: processes %s survived SIGKILL", self.name, self.survivors)
        super().kill()

    def cleanup(self) -> None:
        if self.cgroup is not None and not self.cgroup.remove():
            log.error("box %s: cgroup %s could not be removed", self.name, self.cgroup.name)
        if self.bound is not None:
            quota.unmount(self.bound)
        if self.quota_image is not None:
            if self.keep_workspace:
                log.warning("box %s: a quota workspace cannot outlive its box; removing it", self.name)
            quota.destroy(self.quota_image, self.workspace or "")
        elif self.workspace and not self.keep_workspace and self.bound is None:
            shutil.rmtree(self.workspace, ignore_errors=True)
        remove_box_dir(self.box_dir)

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["box_uid"] = self.hello.get("uid")
        if self.cgroup is not None:
            out["cgroup"] = self.cgroup.name
        return out

    def memory_bytes(self) -> int | None:
        return self.cgroup.memory_current() if self.cgroup else None


def _preexec(cg: cgroups.BoxCgroup | None, uid: int | None):
    procs_files = cg.procs_files() if cg else []

    def run() -> None:  # runs in the forked child: only async-signal-safe-ish syscalls
        pid = str(os.getpid()).encode()
        for path in procs_files:
            fd = os.open(path, os.O_WRONLY)
            os.write(fd, pid)
            os.close(fd)
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)

    return run


def start(settings: JailSettings, workspace: str | None = None) -> JailBox:
    """Start one box with its agent ready (raises on any failure, leaving nothing behind)."""
    name = f"jail-{os.getpid()}-{next(_counter)}-{secrets.token_hex(3)}"
    box_dir = os.path.join(boxes_dir(), name)
    os.makedirs(box_dir, mode=0o755)
    root = os.geteuid() == 0
    uid = HOST_UID if (root and settings.drop_uid) else None
    cg: cgroups.BoxCgroup | None = None
    quota_image: str | None = None
    ws_host: str | None = workspace
    seccomp_fd: int | None = None
    bound: str | None = None
    try:
        if settings.use_cgroups:
            cg = cgroups.BoxCgroup.create(name, cgroups.Limits(settings.memory_bytes, settings.pids,
                                                               settings.cpus))
        if workspace is None and quota.loop_quota_possible()[0]:
            ws_host = os.path.join(box_dir, "workspace")
            quota_image = os.path.join(box_dir, "workspace.img")
            quota.create(quota_image, ws_host, settings.disk_bytes, uid if uid is not None else os.getuid())
        elif workspace is not None and uid is not None:
            # The box uid may not be able to traverse the caller's path: bind it into the box dir.
            _own_tree(workspace, uid)
            ws_host = bound = os.path.join(box_dir, "workspace")
            quota.bind(workspace, bound)
        seccomp_fd = seccomp.bpf_fd()
        limits = {"memory_bytes": settings.memory_bytes, "fsize_bytes": settings.disk_bytes, "nofile": 1024}
        spec = bwrap.BoxSpec(
            runtime=settings.runtime, agent_root=settings.agent_root, etc_dir=settings.etc_dir,
            env=bwrap.box_env(), agent_limits=limits, seccomp_fd=seccomp_fd, workspace_host=ws_host,
            ws_size=settings.disk_bytes, tmp_size=settings.tmp_bytes, preload=settings.preload,
        )
        argv = bwrap.build_argv(spec, bwrap.bwrap_path() or "bwrap")
        errlog = os.open(os.path.join(box_dir, "bwrap.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            proc = _spawner.submit(
                subprocess.Popen, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog,
                env={"PATH": "/usr/bin:/bin"}, cwd="/", close_fds=True, pass_fds=(seccomp_fd,),
                preexec_fn=_preexec(cg, uid),
            ).result()
        finally:
            os.close(errlog)
    except BaseException:
        if seccomp_fd is not None:
            os.close(seccomp_fd)
        if bound is not None:
            quota.unmount(bound)
        if cg is not None:
            cg.kill_all()
            cg.remove()
        if quota_image is not None:
            quota.destroy(quota_image, ws_host or "")
        remove_box_dir(box_dir)
        raise
    os.close(seccomp_fd)
    box = JailBox(name, proc, workspace if bound else ws_host, limits, cg, box_dir, quota_image, bound)
    if workspace is not None:
        box.keep_workspace = True
    try:
        box.client.wait_ready(READY_TIMEOUT)
    except Exception as e:
        detail = _tail(os.path.join(box_dir, "bwrap.log"))
        box.destroyed = True
        box.kill()
        box.cleanup()
        if detail:
            raise RuntimeError(f"{e}; bwrap said: {detail}") from e
        raise
    return box


def reap_stale() -> list[str]:
    """Clean up boxes left by execbox processes that died without destroying them.

    A box dir is named ``jail-<owner pid>-...``; if that pid no longer exists its processes,
    cgroup (where this process's layout can see it), mounts and files are removed.
    """
    reaped: list[str] = []
    root = boxes_dir()
    try:
        names = os.listdir(root)
    except FileNotFoundError:
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
        ws = os.path.join(box_dir, "workspace")
        quota.unmount(ws)
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


def _own_tree(path: str, uid: int) -> None:
    """Hand a caller-provided workspace to the box uid (files the host wrote there too)."""
    os.makedirs(path, exist_ok=True)
    for dirpath, dirnames, filenames in os.walk(path):
        for n in [*dirnames, *filenames]:
            try:
                os.lchown(os.path.join(dirpath, n), uid, uid)
            except OSError:
                pass
    os.chown(path, uid, uid)


def _tail(path: str, limit: int = 400) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()[-limit:].strip()
    except OSError:
        return ""
