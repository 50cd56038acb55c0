"""The jail's seccomp policy as an OCI/Docker seccomp profile, for runc and runsc boxes.

One policy, two encodings: boxes/seccomp.py compiles it to BPF for bubblewrap; this module
writes the same deny list as the JSON profile Docker passes to its runtime
(``security_opt=["seccomp=<json>"]``). runc loads it into the kernel; runsc (gVisor) applies it
inside its sentry only when the runtime is registered with ``--oci-seccomp`` (otherwise gVisor
silently ignores it: ``runsc_applies_seccomp()`` lets the provider refuse to start without it).

Default action allow, the listed calls answered with EPERM, like the jail: new user/mount (and
any other) namespaces, mount family, ptrace and cross-process memory access, keyrings, bpf,
perf_event_open, module loading, io_uring, Linux AIO and host-wide clocks. ``setuid``/``setgid`` stay
allowed: the agent uses them once per child to drop user code to the sandbox uid.
"""

from __future__ import annotations

import errno
import json
import platform
from typing import Any

from ..agent.pidns import CLONE_NEWPID, PROC_MOUNT_FLAGS
from .seccomp import CLONE_NAMESPACE_FLAGS, DENIED_SYSCALLS, TIOCSTI

DOCKER_EXTRA_DENIED: tuple[str, ...] = (
    # Obsolete or foreign-ABI entry points Docker's own default profile also refuses.
    "vm86", "vm86old", "create_module", "get_kernel_syms", "query_module", "pciconfig_iobase",
    "pciconfig_read", "pciconfig_write", "_sysctl",
)

_ARCHES = {"x86_64": ["SCMP_ARCH_X86_64"], "aarch64": ["SCMP_ARCH_AARCH64"]}


def is_gvisor(runtime: str) -> bool:
    return runtime.startswith("runsc") or "gvisor" in runtime


def profile(runtime: str = "runc") -> dict[str, Any]:
    """The profile as a dict (Docker's JSON schema, which runc and runsc both read)."""
    eperm = {"action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    denied = set(DENIED_SYSCALLS) | set(DOCKER_EXTRA_DENIED)
    narrowed: list[dict[str, Any]] = []
    if is_gvisor(runtime):
        # The agent puts user code in a PID namespace of its own (agent/pidns.py): exactly
        # unshare(CLONE_NEWPID) and a nosuid,nodev,noexec mount (its /proc) stay
        # possible; any other flags are refused here, and user code, which holds no
        # capability, is refused those two by the (gVisor) kernel as well.
        denied -= {"unshare", "mount"}
        narrowed = [
            {"names": ["unshare"], **eperm,
             "args": [{"index": 0, "value": CLONE_NEWPID, "valueTwo": 0, "op": "SCMP_CMP_NE"}]},
            {"names": ["mount"], **eperm,
             "args": [{"index": 3, "value": PROC_MOUNT_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_NE"}]},
        ]
    rules: list[dict[str, Any]] = [{"names": sorted(denied), **eperm}, *narrowed]
    if not is_gvisor(runtime):
        # clone3 hides its flags in memory a filter cannot read: ENOSYS makes libc fall back to
        # clone(2), whose namespace flags the rules below refuse. Not for gVisor: it has no
        # clone3 (answers ENOSYS itself) and its OCI seccomp ignores errnoRet, so the rule
        # would turn into EPERM and break every thread start (glibc falls back on ENOSYS only).
        rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})
    rules += [
        {"names": ["ioctl"], **eperm,
         "args": [{"index": 1, "value": 0xFFFFFFFF, "valueTwo": TIOCSTI, "op": "SCMP_CMP_MASKED_EQ"}]},
    ]
    for flag in sorted(CLONE_NAMESPACE_FLAGS.values()):  # one rule per flag: args in a rule are ANDed
        rules.append({"names": ["clone"], **eperm,
                      "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}]})
    out: dict[str, Any] = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": rules}
    arches = _ARCHES.get(platform.machine())
    if arches:
        out["architectures"] = arches  # native ABI only: i386/x32 entry points are not allowed
    return out


def security_opt(runtime: str = "runc") -> str:
    """The ``seccomp=...`` entry for a container's ``security_opt``."""
    return "seccomp=" + json.dumps(profile(runtime), separators=(",", ":"), sort_keys=True)


def runsc_applies_seccomp(docker_info: dict[str, Any], runtime: str) -> bool:
    """True when the named gVisor runtime is registered with ``--oci-seccomp``."""
    entry = (docker_info.get("Runtimes") or {}).get(runtime) or {}
    args = entry.get("runtimeArgs") or entry.get("RuntimeArgs") or []
    return any(a in ("--oci-seccomp", "--oci-seccomp=true", "-oci-seccomp") for a in args)
