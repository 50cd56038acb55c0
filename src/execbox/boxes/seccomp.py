"""The jail's seccomp filter: deny the syscalls a box never needs and that widen the kernel's
attack surface (ptrace, mount, namespaces, keyrings, BPF, module loading, ...).

Built with libseccomp (pyseccomp, a ctypes binding) and exported as a BPF program that
bubblewrap loads from a file descriptor (``--seccomp FD``) just before it execs the agent, so
the agent and everything it forks run under it. Denied calls fail with EPERM (the code sees a
clean error, the test can assert it); syscalls of a foreign architecture (i386/x32 entry
points, a classic filter bypass) kill the process.
"""

from __future__ import annotations

import errno
import os
import threading

DENIED_SYSCALLS: tuple[str, ...] = (
    # debugging other processes / reading their memory
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # filesystems and mounts
    "mount", "umount", "umount2", "pivot_root", "chroot", "mount_setattr", "move_mount",
    "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "swapon", "swapoff",
    "open_by_handle_at", "name_to_handle_at", "quotactl", "quotactl_fd",
    # namespaces
    "unshare", "setns",
    # kernel keyrings
    "keyctl", "add_key", "request_key",
    # kernel extension points
    "bpf", "perf_event_open", "userfaultfd", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "lookup_dcookie", "fanotify_init",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # Linux AIO: one io_setup(65536) reserved the host-wide fs.aio-max-nr for every other box
    # and host service; software that uses it falls back to ordinary I/O on ENOSYS/EPERM
    "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents",
    # host-wide state
    "reboot", "acct", "syslog", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "iopl", "ioperm", "vhangup", "nfsservctl", "uselib", "sysfs", "ustat",
)
"""Syscalls answered with EPERM inside every box (names libseccomp does not know are skipped)."""

CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
"""clone(2) flags that create namespaces: denied like unshare(2)."""

TIOCSTI = 0x5412  # push bytes into a terminal's input queue (a classic sandbox escape)

_lock = threading.Lock()
_bpf_cache: bytes | None = None


class SeccompUnavailable(RuntimeError):
    """libseccomp or its Python binding is missing: the jail cannot build its filter."""


def build_filter():  # -> pyseccomp.SyscallFilter
    """The filter object (default allow; the deny list above answered with EPERM)."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as e:  # OSError: binding present, libseccomp.so missing
        raise SeccompUnavailable(f"pyseccomp/libseccomp not usable: {e}") from e
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    f.set_attr(sc.Attr.CTL_NNP, 1)
    eperm = sc.ERRNO(errno.EPERM)
    for name in DENIED_SYSCALLS:
        try:
            f.add_rule(eperm, name)
        except (OSError, ValueError, RuntimeError):
            continue  # not a syscall on this architecture / libseccomp version
    for flag in CLONE_NAMESPACE_FLAGS.values():
        f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    # clone3 passes its flags in memory a filter cannot read: answer ENOSYS so libc falls back
    # to clone(2), whose flags the rules above do check.
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, TIOCSTI))
    return f


def bpf_program() -> bytes:
    """The compiled BPF program (built once per process)."""
    global _bpf_cache
    with _lock:
        if _bpf_cache is None:
            f = build_filter()
            fd = os.memfd_create("execbox-seccomp-build", os.MFD_CLOEXEC)
            try:
                with os.fdopen(os.dup(fd), "wb") as out:
                    f.export_bpf(out)
                size = os.lseek(fd, 0, os.SEEK_END)
                _bpf_cache = os.pread(fd, size, 0)
            finally:
                os.close(fd)
            if not _bpf_cache:
                raise SeccompUnavailable("libseccomp exported an empty BPF program")
        return _bpf_cache


def bpf_fd() -> int:
    """A fresh fd positioned at the start of the BPF program, for ``bwrap --seccomp FD``.

    The caller passes it to the child (pass_fds) and closes its own copy after the spawn.
    """
    program = bpf_program()
    fd = os.memfd_create("execbox-seccomp", 0)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
