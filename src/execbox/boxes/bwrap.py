"""bubblewrap command line for one box: namespaces, a read-only system, a private workspace.

A pure function of a ``BoxSpec`` (no I/O besides checking which host paths exist), so the
argv can be unit-tested and reviewed. Nothing here ever comes from user input: the code a box
runs arrives later over the agent protocol, never on the command line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field

from . import staged_leases
from .box import AGENT_BOOT
from .images import HOME_ALIAS
from .runtime import AGENT_PACKAGE, AGENT_ROOT_IN_BOX, Runtime, jail_dir

BOX_UID = 1000
BOX_GID = 1000
BOX_USER = "sandbox"
WORKSPACE = "/workspace"
HOSTNAME = "execbox"

ETC_FROM_HOST = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "mime.types", "alternatives",
)
"""The only host /etc entries a box sees (no passwd, shadow, resolv.conf, hosts or secrets)."""

MERGED_USR = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
HOST_ETC = "/etc"  # where staged_etc copies ETC_FROM_HOST from


def bwrap_path() -> str | None:
    return shutil.which("bwrap", path="/usr/bin:/usr/local/bin:/bin")


@dataclass
class BoxSpec:
    runtime: Runtime
    agent_root: str  # host dir holding execbox_agent/
    etc_dir: str  # the box's whole /etc (staged_etc): synthetic passwd, group... plus ETC_FROM_HOST
    env: dict[str, str]
    agent_limits: dict[str, int]
    seccomp_fd: int | None
    workspace_host: str | None = None  # bind this host dir; None = a private tmpfs of ws_size
    ws_size: int = 512 * 1024 * 1024
    tmp_size: int = 256 * 1024 * 1024
    preload: str = "auto"
    oneshot: bool = False  # the agent serves one run (agent --oneshot: no imports for later runs)
    extra_ro: list[tuple[str, str]] = field(default_factory=list)
    device_args: list[str] = field(default_factory=list)  # GPU opt-in (boxes/gpu.py); empty: no devices
    share_net: bool = False  # run in the caller's network namespace (boxes/jail_net.py made it)
    pts_host: str | None = None  # a capped devpts instance bound on /dev/pts (boxes/devpts.py); None: bwrap's
    writable_runtime: bool = False  # template builds only (boxes/build_box.py): the version being built, read-write


def usr_mounts() -> list[str]:
    """/usr read-only plus /bin, /lib... as symlinks (merged /usr) or read-only binds."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in MERGED_USR:
        host = "/" + name
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, host]
    return args


def system_mounts() -> list[str]:
    """``usr_mounts`` plus the host's ETC_FROM_HOST entries bound one by one (probes and
    baselines; a box binds its whole staged /etc instead: ``staged_etc``)."""
    args = usr_mounts()
    for name in ETC_FROM_HOST:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args


PROC_MASKED = ("/proc/diskstats", "/proc/partitions")
"""Host-wide /proc files read as empty in a box: they list every box's workspace loop device, with
its I/O counters, so one tenant could watch another's disk activity (Docker masks them too)."""
PROC_MASKS = [a for p in PROC_MASKED for a in ("--dev-bind", "/dev/null", p)]  # --bind is nodev: EACCES


def build_argv(spec: BoxSpec, bwrap: str = "bwrap") -> list[str]:
    argv = [
        bwrap,
        "--unshare-all", "--unshare-user", "--unshare-cgroup",  # user, pid, net, ipc, uts, mount, cgroup
        *(["--share-net"] if spec.share_net else []),
        "--disable-userns",  # no nested user namespaces (seccomp also denies unshare/clone flags)
        "--uid", str(BOX_UID), "--gid", str(BOX_GID), "--hostname", HOSTNAME,
        "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        # The agent is pid 1: no bwrap init inside the box holding the protocol pipes (code could
        # reopen them through /proc/1/fd); the agent reaps orphans as it does as a subreaper.
        "--as-pid-1",
        *usr_mounts(),
        "--ro-bind", spec.etc_dir, "/etc",  # the whole /etc in one mount (staged_etc)
        "--proc", "/proc", "--dev", "/dev",
        *PROC_MASKS,
        # --dev-bind: a plain --bind is nodev, and every pty is a device node
        *(["--dev-bind", spec.pts_host, "/dev/pts"] if spec.pts_host else []),
        "--perms", "1777", "--size", str(spec.tmp_size), "--tmpfs", "/tmp",
        "--perms", "1777", "--size", str(spec.tmp_size), "--tmpfs", "/dev/shm",
        "--perms", "0755", "--dir", "/opt",
        # E2B programs (and their SDK's file paths) use /home/user: the same workspace
        "--perms", "0755", "--dir", "/home", "--symlink", WORKSPACE, HOME_ALIAS,
        "--ro-bind", os.path.join(spec.agent_root, AGENT_PACKAGE), f"{AGENT_ROOT_IN_BOX}/{AGENT_PACKAGE}",
    ]
    for src, dest in spec.runtime.mounts():
        argv += ["--bind" if spec.writable_runtime else "--ro-bind", src, dest]
    for src, dest in spec.extra_ro:
        argv += ["--ro-bind", src, dest]
    argv += spec.device_args
    if spec.workspace_host:
        argv += ["--bind", spec.workspace_host, WORKSPACE]
    else:
        argv += ["--perms", "0700", "--size", str(spec.ws_size), "--tmpfs", WORKSPACE]
    argv += ["--remount-ro", "/", "--chdir", WORKSPACE, "--clearenv"]  # only /workspace and /tmp writable
    for key, value in sorted(spec.env.items()):
        argv += ["--setenv", key, value]
    if spec.seccomp_fd is not None:
        argv += ["--seccomp", str(spec.seccomp_fd)]
    argv += [
        "--", spec.runtime.python, "-I", "-c", AGENT_BOOT, AGENT_ROOT_IN_BOX, f"{AGENT_PACKAGE}.main",
        "--workspace", WORKSPACE, "--preload", spec.preload, "--limits", json.dumps(spec.agent_limits),
    ]
    if spec.oneshot:
        argv.append("--oneshot")
    return argv


def box_env() -> dict[str, str]:
    """The whole environment of a box, built from scratch (nothing of the host's leaks in)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": WORKSPACE,
        "USER": BOX_USER,
        "LOGNAME": BOX_USER,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }


ETC_FILES = {
    "passwd": f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
              f"{BOX_USER}:x:{BOX_UID}:{BOX_GID}:execbox sandbox:{WORKSPACE}:/bin/bash\n"
              f"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "group": f"root:x:0:\n{BOX_USER}:x:{BOX_GID}:\nnogroup:x:65534:\n",
    "hosts": f"127.0.0.1\tlocalhost {HOSTNAME}\n::1\tlocalhost ip6-localhost\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
}


def staged_etc(dirname: str = "box-etc", files: dict[str, str] | None = None,
               mount_points: tuple[str, ...] = ()) -> str:
    """The box's whole /etc as one directory, bound with one mount instead of ten (~1 ms of CPU
    on every box start): the synthetic ``files`` (default ETC_FILES), copies of the host's
    ETC_FROM_HOST entries, and empty directories for ``mount_points`` (where more is bound on
    top, inside this read-only /etc).

    Staged as ``<jail dir>/<dirname>-<digest>``, the digest covering ``files`` and the host
    entries' lstat: a host change (ldconfig, update-alternatives) gives a new directory at the
    next box start, while boxes already running keep the one they mounted. Never rewritten in
    place; concurrent starts (other processes too) agree on the name and publish it atomically.
    """
    files = ETC_FILES if files is None else files
    sig = [repr(sorted(files.items())), repr(mount_points)]
    for name in ETC_FROM_HOST:
        try:
            st = os.lstat(os.path.join(HOST_ETC, name))
            sig.append(f"{name}:{st.st_mode}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            sig.append(f"{name}:-")
    key = "\n".join([jail_dir(), *sig])
    cached = _staged_etc.get(dirname)
    if cached is not None and cached[0] == key:
        return cached[1]
    final = os.path.join(jail_dir(), f"{dirname}-{hashlib.sha256(key.encode()).hexdigest()[:16]}")
    os.makedirs(jail_dir(), mode=0o755, exist_ok=True)
    staged_leases.hold(final)  # boxes of this process mount it: no sweep may remove it now
    if not os.path.isdir(final):
        _publish_etc(final, files, mount_points)
    _staged_etc[dirname] = (key, final)
    return final


_staged_etc: dict[str, tuple[str, str]] = {}


def _publish_etc(final: str, files: dict[str, str], mount_points: tuple[str, ...]) -> None:
    tmp = f"{final}.tmp-{os.getpid()}-{os.urandom(3).hex()}"
    os.makedirs(tmp, mode=0o755)
    try:
        for name, content in files.items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                f.write(content)
        for name in ETC_FROM_HOST:
            src, dst = os.path.join(HOST_ETC, name), os.path.join(tmp, name)
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)  # localtime -> /usr/share/zoneinfo/...
            elif os.path.isdir(src):
                shutil.copytree(src, dst, symlinks=True)  # alternatives: symlinks into /usr
            elif os.path.isfile(src):
                shutil.copyfile(src, dst)
        for rel in mount_points:
            os.makedirs(os.path.join(tmp, rel), mode=0o755, exist_ok=True)
        for root, dirs, names in os.walk(tmp):  # world-readable: the box's uid is not ours
            for entries, mode in ((dirs, 0o755), (names, 0o644)):
                for n in entries:  # os.walk lists links to directories in dirs: never follow one
                    path = os.path.join(root, n)
                    if not os.path.islink(path):
                        os.chmod(path, mode)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.isdir(final):  # not a concurrent start that published it first
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
