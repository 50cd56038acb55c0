"""One PID namespace for all user code, with its own /proc (stdlib only; runsc boxes).

Why: gVisor's /proc (runsc 2022-12, the Debian package) does not apply the kernel's
ptrace-access check to ``/proc/<pid>/environ`` (mode 0444) and ``/proc/<pid>/fd`` (0555), so
a different uid alone (agent/privsep.py) does not keep user code out of the agent's
environment and open descriptors there. And gVisor hands orphans to the container's init, not
to the agent (no subreaper), so a double-forked ``setsid`` daemon escaped the run's kill.

So, once at start, the agent (still holding CAP_SYS_ADMIN in its permitted set) calls
``unshare(CLONE_NEWPID)``: every child it forks from then on (spares, runs, contexts) lives in
that namespace. Its first child, the namespace's init, mounts a fresh /proc over /proc (this
gVisor's mount namespaces do not isolate mounts, so one /proc for the whole box is also the
only layout that works there) and then only reaps orphans. User code therefore sees the
processes of the namespace alone: not the agent, not the container's init. The agent keeps a
descriptor of the original /proc (``proc_fd``) for its own process bookkeeping (procs.py), and
finds the orphans of a run among the init's children.

The init keeps real uid 0 like the agent (user code cannot signal or trace it), answers no
signal (a namespace init receives only the ones it handles) and dies with the agent
(parent-death signal), taking the namespace with it. Its children drop every capability,
CAP_SYS_ADMIN included, before user code runs (privsep.drop_user_code). Docker grants
CAP_SYS_ADMIN only to runsc boxes, whose capabilities are gVisor's own, and their seccomp
profile allows exactly ``unshare(CLONE_NEWPID)`` and a ``nosuid,nodev,noexec`` mount
(boxes/oci_seccomp.py); user code, holding no capability, is refused both by gVisor as well.
"""

from __future__ import annotations

import os

from .lean import libc, signal

CLONE_NEWPID = 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
PROC_MOUNT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
NOBODY = 65534

proc_fd: int | None = None
"""The agent's own /proc (the container's), opened before the namespace's /proc covered it."""
init_pid: int | None = None
"""The namespace's init, as the agent sees it: orphans of user code become its children."""


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = libc().get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enabled() -> bool:
    return init_pid is not None


def setup() -> None:
    """Once at agent start, after privsep.enter_agent (real uid 0). Raises when impossible."""
    global proc_fd, init_pid
    if _root_is_shared():
        raise OSError("--pid-ns: '/' is a shared mount (a host, not a container): the namespace's "
                      "/proc would be mounted over everyone's")
    euid = os.geteuid()
    fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    ready_r, ready_w = os.pipe()
    try:
        os.seteuid(0)  # the permitted capabilities (CAP_SYS_ADMIN) become effective again
        _check(libc().unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
        pid = os.fork()
        if pid == 0:  # the namespace's init
            _init(ready_w)
        os.seteuid(euid)
        os.close(ready_w)
        ready_w = -1
        answer = os.read(ready_r, 4096)
    except BaseException:
        os.close(fd)
        raise
    finally:
        os.close(ready_r)
        if ready_w >= 0:
            os.close(ready_w)
    if answer != b"ok":
        os.close(fd)
        raise OSError(f"pid namespace init failed: {answer.decode(errors='replace') or 'died'}")
    proc_fd, init_pid = fd, pid


def _root_is_shared() -> bool:
    """True when '/' is in a shared peer group (a host's root; container roots are private)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            return any(line.split()[4] == "/" and " shared:" in line.split(" - ", 1)[0] for line in f)
    except (OSError, IndexError):
        return True


def _init(ready_w: int) -> None:
    """pid 1 of the namespace: mount its /proc, then reap orphans until the agent dies."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        _check(libc().mount(b"proc", b"/proc", b"proc", PROC_MOUNT_FLAGS, None), "mount /proc")
        os.setresuid(0, NOBODY, 0)  # real uid 0 (user code cannot signal it), no effective caps
        libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        os.write(ready_w, b"ok")
    except BaseException as e:  # noqa: BLE001
        os.write(ready_w, str(e).encode()[:4000])
        os._exit(1)
    os.closerange(0, 65536)
    while True:
        signal.sigwait({signal.SIGCHLD})
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break

