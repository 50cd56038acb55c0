"""Start, kill and clean up one jail box: cgroup + workspace quota + seccomp + bubblewrap.

Start order: create the cgroup and the quota-limited workspace, then fork bwrap from a
long-lived spawner thread (``--die-with-parent`` ties a box to the *thread* that forked it,
so a box started from a short-lived request thread would die with that thread). Before bwrap
runs, the child joins the box's cgroup and, when execbox runs as root, drops to an
unprivileged host uid, so even the box's mapped "user" is nobody on the host.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any

from . import bwrap, cgroups, devpts, jail_net, quota, seccomp, uids
from .box import READY_TIMEOUT, ProcessBox
from .jail_reap import boxes_dir, reap_stale, remove_box_dir
from .quota import Workspace
from .runtime import PIP_MOUNT, Runtime
from .staging import staged_pip
from .stderr_sink import Tail, sink

log = logging.getLogger("execbox.jail")

DEFAULT_HOST_UID = uids.DEFAULT_FIRST


def host_uid() -> int:
    """The first host uid of the box range (``uids.configured_range()``); SB002 when malformed.

    Each box runs as its own uid from that range (boxes/uids.py); this is the one the
    trial box of ``execbox doctor`` and the bench use.
    """
    return uids.configured_range().first

# Two long-lived spawner threads (they never exit while the process runs, so --die-with-parent
# holds): a fork of the service for one box does not hold up the next under concurrent starts.
_spawner = ThreadPoolExecutor(max_workers=2, thread_name_prefix="execbox-jail-spawn")
_reaper = ThreadPoolExecutor(max_workers=2, thread_name_prefix="execbox-jail-reap")
_counter = itertools.count(1)
_pending_lock = threading.Lock()
_pending: dict[str, Future] = {}  # box name -> its background teardown
_pending_ws: dict[str, Future] = {}  # caller workspace dir -> teardown that still holds its image


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
    device_args: list[str] = field(default_factory=list)  # GPU binds (boxes/gpu.py), empty by default
    egress: Any = None  # EgressPolicy; not "none": the box gets a namespace behind the gateway
    # Template builds only (boxes/build_box.py), never from a provider's or tenant's settings: the
    # runtime dir is bound read-write and handed to the box's uid; the build's own egress caps.
    writable_runtime: bool = False
    egress_limits: Any = None  # egress.gateway.Limits; None: Limits.from_env()


class JailBox(ProcessBox):
    isolation = "jail"

    def __init__(self, name: str, proc: subprocess.Popen, ws: Workspace, limits: dict[str, Any],
                 cgroup: cgroups.BoxCgroup | None, box_dir: str, lease: uids.UidLease | None = None) -> None:
        super().__init__(name, proc, ws.host_path, limits)
        self.ws = ws
        self.lease = lease  # this box's own host uid (None when execbox is not root)
        self.cgroup = cgroup
        self.box_dir = box_dir
        self.keep_workspace = ws.caller_dir is not None
        self.started_at = time.time()
        self.runtime: Runtime | None = None
        self.survivors: list[int] = []
        self.stderr: Tail | None = None  # last KB of bwrap's and the agent's own stderr
        self.net: jail_net.JailNet | None = None  # set when the box has network egress
        self.pts: str | None = None  # its capped devpts mount on the host (boxes/devpts.py), if any

    def oom_events(self) -> int:
        return self.cgroup.oom_kills() if self.cgroup else 0

    def promote(self) -> None:
        """Handed out of the warm pool: from now on it serves runs at the normal CPU weight."""
        if self.cgroup is not None:
            try:
                self.cgroup.set_background(False)
            except OSError as e:  # the box is being torn down; its next run fails with the reason
                log.warning("jail: could not raise the CPU weight of %s: %s", self.name, e)

    def adopt_workspace(self, caller_dir: str) -> bool:
        """A warm (pooled) box becomes a session's box: its workspace becomes ``caller_dir``."""
        if self.destroyed or not self.ws.adopt(caller_dir):
            return False
        self.workspace = caller_dir
        self.keep_workspace = True
        return True

    def destroy(self) -> None:
        """SIGKILL every process of the box now; unmount and remove the rest in the background.

        The kill is synchronous (the box's pid-namespace init dies with it, so nothing it
        started can keep running); the slower part (waiting for exits, rmdir of the cgroup,
        unmounting and deleting the workspace, ~50 ms) is off the caller's clock. ``drain()``
        waits for it, and a new box for the same caller workspace waits for its image.
        """
        with self._destroy_lock:
            if self.destroyed:
                return
            self.destroyed = True
        pids = self.cgroup.pids() if self.cgroup is not None else [self.proc.pid]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        with _pending_lock:
            try:
                fut = _reaper.submit(self._teardown)
            except RuntimeError:  # the interpreter is exiting (an atexit shutdown): here, then
                fut = None
            else:
                _pending[self.name] = fut
                if self.ws.persistent and self.ws.caller_dir:
                    _pending_ws[self.ws.caller_dir] = fut
        if fut is None:
            self._teardown()

    def _teardown(self) -> None:
        try:
            self.kill()
        finally:
            try:
                self.client.close()
                self.cleanup()
            finally:
                with _pending_lock:
                    _pending.pop(self.name, None)
                    if self.ws.caller_dir and _pending_ws.get(self.ws.caller_dir) is not None:
                        _pending_ws.pop(self.ws.caller_dir, None)

    def kill(self) -> None:
        if self.cgroup is not None:
            self.survivors = self.cgroup.kill_all()
            if self.survivors:
                log.error("box %s: processes %s survived SIGKILL", self.name, self.survivors)
        super().kill()

    def cleanup(self) -> None:
        if self.net is not None:
            self.net.detach()
            self.net = None
        if self.cgroup is not None and not self.cgroup.remove():
            log.error("box %s: cgroup %s could not be removed", self.name, self.cgroup.name)
        if self.pts is not None and devpts.unmount(self.box_dir):
            self.pts = None
        self.ws.teardown()  # a caller's workspace (and its image) stays; the box's own goes
        remove_box_dir(self.box_dir)
        self._release_uid()

    def _release_uid(self) -> None:
        """Give the host uid back, unless a process of the box survived the kill (then it stays
        out of circulation, so no later box shares a uid with a live leftover)."""
        if self.lease is None:
            return
        if self.survivors or (self.cgroup is not None and self.cgroup.exists() and self.cgroup.pids()):
            log.error("box %s: keeping host uid %d leased: processes survived", self.name, self.lease.uid)
            return
        self.lease.release()

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["box_uid"] = self.hello.get("uid")
        if self.lease is not None:
            out["host_uid"] = self.lease.uid
        if self.cgroup is not None:
            out["cgroup"] = self.cgroup.name
        return out

    def memory_bytes(self) -> int | None:
        return self.cgroup.memory_current() if self.cgroup else None


def drain(timeout: float = 30.0) -> bool:
    """Wait for every background box teardown of this process; True if all finished."""
    with _pending_lock:
        futures = list(_pending.values())
    done, not_done = wait_futures(futures, timeout=timeout)
    return not not_done


def _wait_for_workspace(caller_dir: str, timeout: float = 30.0) -> None:
    with _pending_lock:
        fut = _pending_ws.get(caller_dir)
    if fut is not None:
        wait_futures([fut], timeout=timeout)


# Joins the box's cgroups, then execs the rest of its argv. A constant: every value reaches it as
# a positional parameter, never as shell text. Exit 125 (with the shell's message on the box's
# stderr) when a write fails, so the start fails with the reason instead of running unlimited.
_JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


def _launcher(cg: cgroups.BoxCgroup | None, uid: int | None, net_fd: int | None) -> list[str] | None:
    """The argv that joins the box's cgroups, network namespace and uid, then execs bwrap.

    Run through ``sh``, ``nsenter`` and ``setpriv`` (util-linux) rather than a Python
    ``preexec_fn``: without one, subprocess starts the child with vfork(), so the service's
    pages are not copied on write for every box start. None when a tool is missing: the caller
    falls back to :func:`_preexec`.
    """
    steps: list[tuple[str, list[str]]] = []
    if cg is not None:
        steps.append(("sh", ["-c", _JOIN_CGROUPS, "execbox-join", *cg.procs_files()]))
    if net_fd is not None:
        steps.append(("nsenter", [f"--net=/proc/self/fd/{net_fd}", "--no-fork"]))
    if uid is not None:
        steps.append(("setpriv", ["--reuid", str(uid), "--regid", str(uid), "--clear-groups"]))
    argv: list[str] = []
    for name, args in steps:
        path = _tool(name)
        if path is None:
            return None
        argv += [path, *args, "--"]
    return argv


@functools.cache
def _tool(name: str) -> str | None:
    """Looked up once per process: three PATH walks on every box start otherwise."""
    return shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")


def _preexec(cg: cgroups.BoxCgroup | None, uid: int | None):
    """The same as :func:`_launcher`, in the forked child (forces fork() over vfork())."""
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


def start(settings: JailSettings, workspace: str | None = None, background: bool = False,
          tmpfs_workspace: bool = False, oneshot: bool = False) -> JailBox:
    """Start one box with its agent ready (raises on any failure, leaving nothing behind).

    ``background``: a warm-pool refill, started at a low CPU weight until ``promote()``.
    ``tmpfs_workspace``: without ``workspace``, a tmpfs of the quota instead of an image (one-shots).
    ``oneshot``: the box serves a single run; its agent skips what only later runs would share."""
    name = f"jail-{os.getpid()}-{next(_counter)}-{secrets.token_hex(3)}"
    box_dir = os.path.join(boxes_dir(), name)
    root = os.geteuid() == 0
    lease = uids.acquire() if (root and settings.drop_uid) else None  # SB008 when all are in use
    uid = lease.uid if lease is not None else None
    try:
        os.makedirs(box_dir, mode=0o755)
        if workspace is not None:
            _wait_for_workspace(workspace)  # the previous box of this session may still be unmounting
            if quota.is_mounted(workspace) and reap_stale():
                # a box left by a dead execbox process (a replica that died or was killed, whose
                # session this one takes over) still had its image bound there: gone now
                log.warning("jail: removed boxes of dead execbox processes still holding a session workspace")
    except BaseException:
        remove_box_dir(box_dir)
        if lease is not None:
            lease.release()  # not kept out of circulation by a box that never started
        raise
    cg: cgroups.BoxCgroup | None = None
    ws = Workspace(box_dir, workspace, tmpfs=tmpfs_workspace)
    seccomp_fd: int | None = None
    jn: jail_net.JailNet | None = None
    pts: str | None = None
    try:
        pts = devpts.mount(box_dir, uid)  # root: the box's own instance, at most PTYS_PER_BOX ptys
        if jail_net.wanted(settings.egress):
            jn = jail_net.attach(name, settings.egress, ca=jail_net.new_ca(name, settings.egress),
                                 limits=settings.egress_limits)
        if settings.use_cgroups:
            cg = cgroups.BoxCgroup.create(name, cgroups.Limits(settings.memory_bytes, settings.pids,
                                                               settings.cpus))
            if background:
                cg.set_background(True)
        ws.setup(settings.disk_bytes, uid)
        if settings.writable_runtime and uid is not None:
            from .build_box import own_tree

            own_tree(settings.runtime.host_dir or "", uid)  # the build takes it back when the box is gone
        seccomp_fd = seccomp.bpf_fd()
        limits = {"memory_bytes": settings.memory_bytes, "fsize_bytes": settings.disk_bytes, "nofile": 1024}
        if cg is None:
            # No pids cgroup: RLIMIT_NPROC, counted per uid inside the box's own user namespace.
            limits["nproc"] = settings.pids
        spec = bwrap.BoxSpec(
            runtime=settings.runtime, agent_root=settings.agent_root,
            etc_dir=jail_net.staged_etc_net() if jn is not None else bwrap.staged_etc(),
            env={**bwrap.box_env(), **settings.runtime.env()}, agent_limits=limits, seccomp_fd=seccomp_fd,
            workspace_host=ws.bind_src,
            ws_size=settings.disk_bytes, tmp_size=settings.tmp_bytes, preload=settings.preload,
            oneshot=oneshot, device_args=list(settings.device_args), pts_host=pts,
            writable_runtime=settings.writable_runtime,
        )
        if jn is not None:
            spec.share_net = True
            spec.extra_ro = [*spec.extra_ro, *jail_net.extra_mounts(jn)]
            pip_root = staged_pip()  # in-session installs (providers/install.py)
            if pip_root:
                spec.extra_ro.append((pip_root, PIP_MOUNT))
            spec.env.update(jn.box_env())
        argv = bwrap.build_argv(spec, bwrap.bwrap_path() or "bwrap")
        net_fd = jn.net.fd if jn is not None else None
        launcher = _launcher(cg, uid, net_fd)
        spawn: dict[str, Any] = {"pass_fds": (seccomp_fd,) if net_fd is None else (seccomp_fd, net_fd)}
        if launcher is None:
            spawn["preexec_fn"] = jail_net.preexec(_preexec(cg, uid), jn)
        else:
            argv = launcher + argv
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        try:
            proc = _spawner.submit(
                subprocess.Popen, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err_w,
                env={"PATH": "/usr/bin:/bin"}, cwd="/", close_fds=True, **spawn,
            ).result()
        except BaseException:
            os.close(err_r)
            raise
        finally:
            os.close(err_w)
        stderr_tail = sink.watch(err_r)
    except BaseException:
        if seccomp_fd is not None:
            os.close(seccomp_fd)
        if cg is not None:
            cg.kill_all()
            cg.remove()
        if pts is not None:
            devpts.unmount(box_dir)
        ws.teardown()
        remove_box_dir(box_dir)
        if lease is not None:
            lease.release()
        if jn is not None:
            jn.detach()
        raise
    os.close(seccomp_fd)
    box = JailBox(name, proc, ws, limits, cg, box_dir, lease)
    box.runtime = settings.runtime  # what it mounts (result metadata names NAME@vN)
    box.net = jn
    box.pts = pts
    box.stderr = stderr_tail
    try:
        box.client.wait_ready(READY_TIMEOUT)
    except Exception as e:
        box.destroyed = True
        box.kill()
        stderr_tail.closed.wait(2.0)  # the box is dead: its stderr reaches EOF
        detail = stderr_tail.text()
        box.cleanup()
        if detail:
            raise RuntimeError(f"{e}; bwrap said: {detail}") from e
        raise
    return box
