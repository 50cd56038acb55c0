"""Privilege separation between the agent and the user code it forks (stdlib only).

Container boxes (runc, runsc) start the agent as uid 0 with only CAP_SETUID, CAP_SETGID and
CAP_SETPCAP (every other capability dropped by the engine, no-new-privileges set).
``enter_agent`` then keeps the agent's *real and saved* uid 0 and switches only its *effective*
uid/gid to the sandbox user, so:

* files the agent writes for the host (workspace writes, code files) belong to the sandbox user;
* the kernel decides who may signal, ptrace or read ``/proc/<pid>/environ`` of a process from
  its real/saved uids: user code (uid 1000 in all three) matches none of the agent's, so
  ``kill``, ``ptrace`` and ``/proc/<agent>/environ|mem|fd`` are refused (EPERM/EACCES).

``drop_user_code`` is the hook every forked child runs before anything else: it regains
effective uid 0 (allowed: the real uid is 0), empties the capability bounding set, then sets
real, effective and saved uid/gid to the sandbox user, which clears every capability; with
no_new_privs nothing (setuid binaries, file capabilities) can give them back.

Without root at start (the jail: bubblewrap already runs the agent as an unprivileged uid in
its own user namespace with no capabilities) both calls only harden signals: the agent is pid 1
of the box's pid namespace there, and a pid-namespace init receives from inside the namespace
only the signals it handles, so ignoring the ones it does not need makes it unkillable from
user code, while the host still kills it with SIGKILL from outside.
"""

from __future__ import annotations

import os

from .lean import libc, signal

PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_SET_DUMPABLE = 4

IGNORED_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1,
                   signal.SIGUSR2, signal.SIGALRM, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU,
                   signal.SIGVTALRM, signal.SIGPROF, signal.SIGXCPU, signal.SIGXFSZ)
"""Signals the agent never needs: ignored, so user code cannot stop it with them."""


class RunAs:  # neither a dataclass (inspect) nor a NamedTuple (typing): both cost every box start
    __slots__ = ("uid", "gid")

    def __init__(self, uid: int, gid: int) -> None:
        self.uid, self.gid = uid, gid

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunAs) and (self.uid, self.gid) == (other.uid, other.gid)

    def __hash__(self) -> int:
        return hash((self.uid, self.gid))

    def __repr__(self) -> str:
        return f"RunAs(uid={self.uid}, gid={self.gid})"


def parse_run_as(spec: str) -> RunAs | None:
    """``UID:GID`` (both non-zero) or empty/``none`` for no separation."""
    spec = (spec or "").strip()
    if spec in ("", "none"):
        return None
    uid_s, _, gid_s = spec.partition(":")
    uid, gid = int(uid_s), int(gid_s or uid_s)
    if uid <= 0 or gid <= 0:
        raise ValueError(f"--run-as {spec!r}: user code must not run as root")
    return RunAs(uid, gid)


_target: RunAs | None = None


def _prctl(option: int, arg: int) -> int:
    return libc().prctl(option, arg, 0, 0, 0)


def enter_agent(run_as: RunAs | None) -> str:
    """Once, at agent start. Returns the mode for the ready frame: 'uid' or 'none'."""
    global _target
    for sig in IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if run_as is None or os.getuid() != 0:
        return "none"
    _bounding[:] = _bounding_caps()  # read while still uid 0
    libc()  # loaded while still uid 0: the interpreter's files may be readable by root only
    os.setgroups([])
    os.setresgid(0, run_as.gid, 0)
    os.setresuid(0, run_as.uid, 0)  # effective caps are cleared; permitted ones stay for children
    _prctl(PR_SET_DUMPABLE, 0)
    _target = run_as
    return "uid"


def active() -> RunAs | None:
    return _target


def mode() -> str:
    """'uid' when user code runs as another uid than the agent's real uid, else 'none'."""
    return "uid" if _target is not None else "none"


_bounding: list[int] = []  # the capabilities in our bounding set, read once at start


def _bounding_caps() -> list[int]:
    """Bits set in CapBnd (a container keeps only a few: dropping just those is ~3 prctl calls
    per child instead of ~41, each of which costs a credential commit)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("CapBnd:"))
    except (OSError, StopIteration, ValueError):
        return list(range(64))
    return [cap for cap in range(64) if mask >> cap & 1]


def drop_user_code() -> None:
    """First thing in every forked child: become the sandbox user for good (no-op without root).

    Raises on failure: the caller's child then exits before any user code runs.
    """
    for sig in IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)  # the agent's SIG_IGN would survive exec otherwise
    if _target is None:
        return
    os.seteuid(0)  # real uid is 0: allowed, and restores the permitted capabilities
    for cap in _bounding:
        _prctl(PR_CAPBSET_DROP, cap)  # best effort per cap (needs CAP_SETPCAP, which we hold)
    os.setgroups([])
    os.setresgid(_target.gid, _target.gid, _target.gid)
    os.setresuid(_target.uid, _target.uid, _target.uid)  # all three: every capability goes
    if os.getuid() != _target.uid or os.geteuid() != _target.uid:
        raise OSError("privilege drop did not take effect")
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
