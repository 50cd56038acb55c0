"""Process plumbing for the agent: rlimits, subreaper, finding and killing process trees."""

from __future__ import annotations

import errno
import os
import resource
import time

from . import paths, pidns
from .lean import libc, signal

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38


def request_env_and_cwd(ws: str, req: dict, error: type[Exception]) -> tuple[dict[str, str], str]:
    """A run's or background process's ``env`` and ``cwd`` from ``req``, checked the same way for
    both; ``error(message, field=..., [violation=...])`` is raised for what is refused."""
    env = req.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\x00" not in k + v
        for k, v in env.items()
    ):
        raise error("env must map names to string values", field="env")
    try:
        cwd = paths.resolve(ws, req.get("cwd") or ".")
    except paths.PathViolation as e:
        raise error(str(e), field="cwd", violation=e.reason) from None
    if not os.path.isdir(cwd):
        raise error(f"cwd {req.get('cwd')!r} is not a directory", field="cwd")
    return env, cwd


class NoRoomForProcess(Exception):
    """A fork the box's own limits refused: its processes fill the pids limit (EAGAIN) or its
    memory (ENOMEM). The box's code did that, so it is the caller's limit (SB008, 429), not an
    agent failure; the request fails, the agent and the session go on."""

    code, status = "SB008", 429

    def __init__(self, what: str, err: OSError) -> None:
        reason = ("its process limit (pids_limit) is reached" if err.errno == errno.EAGAIN
                  else "it is out of memory" if err.errno == errno.ENOMEM else err.strerror or str(err))
        super().__init__(f"cannot start {what}: the box has no room for another process ({reason}); "
                         "end processes still running in it (background processes, contexts) or reset the session")
        self.details = {"reason": "box_process_limit", "errno": errno.errorcode.get(err.errno or 0, str(err.errno))}


def fork(what: str, close_on_failure: tuple[int, ...] = ()) -> int:
    """``os.fork()``; a refusal by the box's limits becomes :class:`NoRoomForProcess`, and the
    caller's ``close_on_failure`` fds (the pipes made for the child) are closed, not leaked."""
    try:
        return os.fork()
    except OSError as e:
        for fd in close_on_failure:
            try:
                os.close(fd)
            except OSError:
                pass
        if e.errno in (errno.EAGAIN, errno.ENOMEM):
            raise NoRoomForProcess(what, e) from None
        raise


def _prctl(option: int, arg: int) -> bool:
    try:
        return libc().prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Orphans of our executions (daemons) reparent to us, so we can find and kill them."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


PR_SET_DUMPABLE = 4


def set_dumpable(flag: bool) -> bool:
    """Non-dumpable: processes of the same uid can neither ptrace us nor open /proc/<pid>/fd/*.

    The agent holds the protocol pipes to the host; user code runs as the same uid, so without
    this it could reopen them through /proc and write forged frames to the host.
    """
    return _prctl(PR_SET_DUMPABLE, 1 if flag else 0)


def prefer_oom_kill() -> bool:
    """Make this process (and what it forks or execs) the memory-limit OOM killer's first pick.

    The box's memory limit covers the agent too, and the kernel kills the process with the most
    memory: user code that spreads over small processes and fills tmpfs (pages no process owns)
    would otherwise get the agent killed, ending the whole session. Raising one's own
    oom_score_adj needs no privilege (only lowering does), so this works as the sandbox user
    in containers and in the jail; where /proc does not allow it, nothing changes.
    """
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.write(fd, b"1000") == 4
    except OSError:
        return False
    finally:
        os.close(fd)


def die_with_parent() -> bool:
    return _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def no_new_privs() -> bool:
    return _prctl(PR_SET_NO_NEW_PRIVS, 1)


def close_fds_except(keep: tuple[int, ...]) -> None:
    """In a freshly forked child: close every descriptor from 3 up but ``keep``.

    A child inherits whatever the agent held at the fork: the pipes of a run in flight (a
    context forked for a run kept that run's stdout open, so each new context's first run waited
    out the pump's drain grace, ~200 ms), another context's pipes, relay sockets. The child gets
    only what it is handed. One close_range(2) per gap.
    """
    low = 3
    for fd in sorted({k for k in keep if k >= 3}):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, max(low, os.sysconf("SC_OPEN_MAX")))


def apply_rlimits(limits: dict[str, int | None], allow_address_space: bool = True) -> None:
    """Set the limits a request asks for; never raise (a limit the kernel refuses is skipped)."""
    table = {
        "fsize_bytes": resource.RLIMIT_FSIZE,
        "nofile": resource.RLIMIT_NOFILE,
        "nproc": resource.RLIMIT_NPROC,
        "cpu_seconds": resource.RLIMIT_CPU,
    }
    if allow_address_space:
        # RLIMIT_DATA bounds heap and private mappings (what a memory bomb grows) without
        # counting the shared libraries and preloaded modules a forked child inherits.
        table["memory_bytes"] = resource.RLIMIT_DATA
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for key, which in table.items():
        value = limits.get(key)
        if value:
            try:
                resource.setrlimit(which, (int(value), int(value)))
            except (ValueError, OSError):
                pass


def _proc_listdir(rel: str) -> list[str]:
    """List a directory of the agent's own /proc (pidns.proc_fd when user code has another)."""
    if pidns.proc_fd is None:
        return os.listdir(f"/proc/{rel}" if rel else "/proc")
    fd = os.open(rel or ".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=pidns.proc_fd)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def _proc_read(rel: str) -> str:
    if pidns.proc_fd is None:
        with open(f"/proc/{rel}") as f:
            return f.read()
    with open(os.open(rel, os.O_RDONLY, dir_fd=pidns.proc_fd)) as f:
        return f.read()


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` via /proc/<pid>/task/*/children, or a /proc scan."""
    kids: list[int] = []
    task_dir = f"{pid}/task"
    try:
        tids = _proc_listdir(task_dir)
    except OSError:
        return []
    found_file = False
    for tid in tids:
        try:
            text = _proc_read(f"{task_dir}/{tid}/children")
            found_file = True
            kids.extend(int(x) for x in text.split())
        except OSError:
            continue
    if found_file:
        return kids
    return [p for p, pp in _ppid_map().items() if pp == pid]


def _stat_fields(pid: int | str) -> list[str]:
    """``/proc/<pid>/stat`` after the command name (which may hold spaces): state, ppid, ...

    Raises OSError when the process is gone."""
    stat = _proc_read(f"{pid}/stat")
    return stat[stat.rindex(")") + 2 :].split()


def _ppid_map() -> dict[int, int]:
    out = {}
    for name in _proc_listdir(""):
        if not name.isdigit():
            continue
        try:
            out[int(name)] = int(_stat_fields(name)[1])
        except (OSError, ValueError, IndexError):
            continue
    return out


def _zombie(pid: int) -> bool:
    try:
        return _stat_fields(pid)[0] in ("Z", "X")
    except (OSError, ValueError, IndexError):
        return True  # gone already


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    stack = [pid]
    seen = set()
    while stack:
        p = stack.pop()
        for c in children_of(p):
            if c not in seen:
                seen.add(c)
                out.append(c)
                stack.append(c)
    return out


KILL_WAIT = 2.0
"""Seconds kill_tree keeps at it until every target is dead (a zombie): bounded by time, not by a
count of quick rounds, so a slow SIGKILL (a loaded gVisor sentry) is still waited for, and an
unkillable process (uninterruptible sleep) cannot hold a run's reply for longer than this."""


def kill_tree(pid: int, *, keep: set[int] | None = None, include_root: bool = True) -> int:
    """SIGKILL ``pid``'s process group, its descendants, and our untracked orphans.

    An orphan in the session of a process in ``keep`` (a context, a background process: each
    is a session of its own) is that process's daemon, not the run's: it stays, as its
    starter does. Repeats until nothing is left, so a fork bomb racing the kill still ends.
    Returns how many processes were signalled.
    """
    keep = set(keep or ())
    me = os.getpid()
    reapers = [me]
    if pidns.init_pid is not None:  # user code's PID namespace: its orphans go to its init
        keep.add(pidns.init_pid)
        reapers.append(pidns.init_pid)
    # never the session of what is being killed, even when the caller keeps its root alive (a
    # run answered from its exit record: its pid is kept, its orphans are not); a run is a
    # session of its own, so its id is its pid
    kept_sessions = {_sid(k) for k in keep} - {_sid(me), _sid(pidns.init_pid or me), _sid(pid), pid, None}
    total = 0
    deadline = time.monotonic() + KILL_WAIT
    rounds = 0
    while True:
        rounds += 1
        targets = set(descendants(pid)) if include_root or pid != me else set()
        if include_root:
            targets.add(pid)
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        # Orphans reparented to us (we are a subreaper) belong to some execution.
        for orphan in [o for r in reapers for o in children_of(r)]:
            if orphan not in keep and (not kept_sessions or _sid(orphan) not in kept_sessions):
                targets.add(orphan)
                targets.update(descendants(orphan))
        targets -= keep
        targets.discard(me)
        alive = []
        for t in targets:
            if _zombie(t):  # dead, only not reaped yet: signalling it "succeeds" and would spin this loop
                continue
            try:
                os.kill(t, signal.SIGKILL)
                alive.append(t)
            except OSError:
                pass
        if not alive or time.monotonic() > deadline:
            break
        total += len(alive)
        time.sleep(0.002 if rounds < 50 else 0.02)  # a bomb is beaten in the first rounds; then a slow kill
        include_root = False
    return total


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def reap_all() -> list[tuple[int, int, resource.struct_rusage]]:
    """Reap every exited child without blocking."""
    out = []
    while True:
        try:
            pid, status, ru = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        out.append((pid, status, ru))
    return out


def decode_status(status: int) -> tuple[int, int | None]:
    """(exit_code, signal) with exit_code = -signal for a killed process."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return -sig, sig
    return os.waitstatus_to_exitcode(status), None


def died(status: int, ru: object = None) -> dict:
    """A context's end as a run reports it: exit code, signal, and its peak memory (the process's
    lifetime high-water mark, where its rusage came with the status: an OOM kill's is what the
    run needed)."""
    code, sig = decode_status(status)
    peak = getattr(ru, "ru_maxrss", None)
    return {"exit_code": code, "signal": sig, "died": True, "peak_memory_kb": peak}
