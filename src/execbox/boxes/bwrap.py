"""bubblewrap command line for one box: namespaces, a read-only system, a private workspace.

A pure function of a ``BoxSpec`` (no I/O besides checking which host paths exist), so the
argv can be unit-tested and reviewed. Nothing here ever comes from user input: the code a box
runs arrives later over the agent protocol, never on the command line.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field

from .box import AGENT_BOOT
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


def bwrap_path() -> str | None:
    return shutil.which("bwrap", path="/usr/bin:/usr/local/bin:/bin")


@dataclass
class BoxSpec:
    runtime: Runtime
    agent_root: str  # host dir holding execbox_agent/
    etc_dir: str  # host dir with the box's passwd, group, hosts, nsswitch.conf
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


def system_mounts() -> list[str]:
    """/usr read-only plus /bin, /lib... as symlinks (merged /usr) or read-only binds."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in MERGED_USR:
        host = "/" + name
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, host]
    for name in ETC_FROM_HOST:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args


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
        *system_mounts(),
    ]
    for name in ("passwd", "group", "hosts", "nsswitch.conf"):
        argv += ["--ro-bind", os.path.join(spec.etc_dir, name), f"/etc/{name}"]
    argv += [
        "--proc", "/proc", "--dev", "/dev",
        "--perms", "1777", "--size", str(spec.tmp_size), "--tmpfs", "/tmp",
        "--perms", "1777", "--size", str(spec.tmp_size), "--tmpfs", "/dev/shm",
        "--perms", "0755", "--dir", "/opt",
        "--ro-bind", os.path.join(spec.agent_root, AGENT_PACKAGE), f"{AGENT_ROOT_IN_BOX}/{AGENT_PACKAGE}",
    ]
    for src, dest in [*spec.runtime.mounts(), *spec.extra_ro]:
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


def staged_etc() -> str:
    """A directory holding the box's synthetic /etc files (written once, world-readable)."""
    return stage_files("box-etc", ETC_FILES)


def stage_files(dirname: str, files: dict[str, str]) -> str:
    """``<jail dir>/<dirname>`` holding ``files`` (name -> content), world-readable; a file is
    rewritten (atomically) only when its content differs, so concurrent box starts agree."""
    d = os.path.join(jail_dir(), dirname)
    os.makedirs(d, mode=0o755, exist_ok=True)
    for name, content in files.items():
        path = os.path.join(d, name)
        try:
            with open(path, encoding="utf-8") as f:
                if f.read() == content:
                    continue
        except OSError:
            pass
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    return d
