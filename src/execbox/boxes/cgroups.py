"""Per-box cgroups (v1 and v2): memory, pids and CPU limits, OOM counting, kill-everything.

Each box gets its own cgroup created beneath the cgroup this process already lives in (for
every controller on v1, once on v2), so execbox works inside a container or a systemd slice
that delegated its subtree. The box's first process joins the cgroup before it execs bwrap,
so every descendant is counted and can be found again: destroy kills whatever is listed in
the cgroup, even a process that daemonized, then removes the cgroup.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass, field

from .oom_counter import OomCounter, parse_oom_kills

CGROUP_ROOT = "/sys/fs/cgroup"
V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
PARENT_NAME = "execbox"
SERVICE_LEAF = "execbox-service"  # v2: where execbox moves the processes of the group it hands down from
CFS_PERIOD_US = 100_000


class CgroupUnavailable(RuntimeError):
    """No writable cgroup hierarchy for the limits the jail applies."""


def _read(path: str) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _mounts() -> dict[str, str]:
    """Controller name (or 'cgroup2') -> mount point, from /proc/self/mountinfo."""
    out: dict[str, str] = {}
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _source, options = (right.split() + ["", "", ""])[:3]
            mountpoint = left.split()[4]
            if fstype == "cgroup2":
                out.setdefault("cgroup2", mountpoint)
            elif fstype == "cgroup":
                for opt in options.split(","):
                    if opt in V1_CONTROLLERS or opt == "cpuacct":
                        out.setdefault(opt, mountpoint)
    return out


def _own_paths() -> dict[str, str]:
    """Controller (or '' for the v2 hierarchy) -> this process's cgroup path."""
    out: dict[str, str] = {}
    with open("/proc/self/cgroup", encoding="utf-8") as f:
        for line in f:
            _hid, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    return out


@dataclass
class Layout:
    """Where box cgroups are created: one parent directory per controller (v1) or one (v2)."""

    version: int
    parents: dict[str, str] = field(default_factory=dict)  # controller -> parent dir ("" on v2)

    def describe(self) -> str:
        where = ", ".join(f"{k or 'unified'}={v}" for k, v in sorted(self.parents.items()))
        return f"cgroup v{self.version}: {where}"


_layout: Layout | None = None
_layout_error: str | None = None


def detect() -> Layout:
    """The usable layout on this host (cached); CgroupUnavailable says why there is none."""
    global _layout, _layout_error
    if _layout is not None:
        return _layout
    if _layout_error is not None:
        raise CgroupUnavailable(_layout_error)
    try:
        _layout = _detect()
        return _layout
    except CgroupUnavailable as e:
        _layout_error = str(e)
        raise


def _detect() -> Layout:
    mounts = _mounts()
    own = _own_paths()
    v1 = [c for c in ("memory", "pids", "cpu") if c in mounts]
    if v1:
        parents: dict[str, str] = {}
        for ctrl in (*v1, "freezer"):
            if ctrl not in mounts:
                continue
            parent = os.path.join(mounts[ctrl], own.get(ctrl, "/").lstrip("/"), PARENT_NAME)
            try:
                os.makedirs(parent, exist_ok=True)
            except OSError as e:
                if ctrl == "freezer":
                    continue
                raise CgroupUnavailable(f"cannot create {parent}: {e.strerror}") from None
            if not os.access(parent, os.W_OK):
                if ctrl == "freezer":
                    continue
                raise CgroupUnavailable(f"{parent} is not writable by uid {os.geteuid()}")
            parents[ctrl] = parent
        missing = [c for c in ("memory", "pids", "cpu") if c not in parents]
        if missing:
            raise CgroupUnavailable(f"cgroup v1 controllers not mounted: {', '.join(missing)}")
        _weigh_parent(os.path.join(parents["cpu"], "cpu.shares"), 1024)
        return Layout(1, parents)
    if "cgroup2" in mounts:
        return Layout(2, {"": _prepare_v2(mounts["cgroup2"], own.get("", "/"))})
    raise CgroupUnavailable("no cgroup filesystem is mounted")


def _prepare_v2(mount: str, own: str) -> str:
    """Make <own cgroup>/execbox a parent with memory, pids and cpu delegated to its children.

    v2 forbids processes in a cgroup that distributes controllers, so when this process sits
    in the cgroup we need, it moves itself into a leaf ``<own>/execbox-service`` first.
    """
    base = os.path.join(mount, own.lstrip("/"))
    wanted = ("memory", "pids", "cpu")
    above = os.path.dirname(base)
    if os.path.basename(base) == SERVICE_LEAF and _hands_down(above, wanted):
        # started inside the leaf an earlier execbox made (a shell that ran `execbox run`, a
        # supervisor that restarts the service in its group): share that execbox's parent
        # instead of nesting a leaf in the leaf at every start, and moving the starter again
        base = above
    available = _read(os.path.join(base, "cgroup.controllers")).split()
    missing = [c for c in wanted if c not in available]
    if missing:
        raise CgroupUnavailable(f"cgroup v2 controllers not delegated to {base}: {', '.join(missing)}")
    enable = " ".join(f"+{c}" for c in wanted)
    try:
        _write(os.path.join(base, "cgroup.subtree_control"), enable)
    except OSError as e:
        if e.errno != errno.EBUSY:
            raise CgroupUnavailable(f"cannot enable controllers in {base}: {e.strerror}") from None
        leaf = os.path.join(base, SERVICE_LEAF)
        os.makedirs(leaf, exist_ok=True)
        for pid in _read(os.path.join(base, "cgroup.procs")).split():
            try:
                _write(os.path.join(leaf, "cgroup.procs"), pid)
            except OSError:
                pass
        try:
            _write(os.path.join(base, "cgroup.subtree_control"), enable)
        except OSError as e2:
            raise CgroupUnavailable(f"cannot enable controllers in {base}: {e2.strerror}") from None
    parent = os.path.join(base, PARENT_NAME)
    if not os.access(base, os.W_OK):
        raise CgroupUnavailable(f"{base} is not writable by uid {os.geteuid()} (delegate it)")
    try:
        os.makedirs(parent, exist_ok=True)
        _write(os.path.join(parent, "cgroup.subtree_control"), enable)
    except OSError as e:
        raise CgroupUnavailable(f"cannot prepare {parent}: {e.strerror}") from None
    _weigh_parent(os.path.join(parent, "cpu.weight"), 100)
    return parent


def _hands_down(group: str, controllers: tuple[str, ...]) -> bool:
    """Whether ``group`` already enables ``controllers`` for its children."""
    try:
        return set(controllers) <= set(_read(os.path.join(group, "cgroup.subtree_control")).split())
    except OSError:
        return False


def _weigh_parent(path: str, per_cpu: int) -> None:
    """Give the parent of all boxes the CPU weight of one busy process per host CPU.

    Every box is a child of one ``execbox`` group, so without this all boxes together would
    compete for CPU like a single process against everything else on the host.
    """
    try:
        _write(path, str(min(per_cpu * (os.cpu_count() or 1), 10_000 if per_cpu == 100 else 262_144)))
    except OSError:
        pass


# A starting pool box's CPU weight: 1/8 of a serving box's (v1 cpu.shares 1024, v2 cpu.weight
# 100), low enough to yield to runs, high enough that a busy host does not starve the refill.
BACKGROUND_SHARES = 128
BACKGROUND_WEIGHT = 12


@dataclass
class Limits:
    memory_bytes: int
    pids: int
    cpus: float


class BoxCgroup:
    """The cgroup(s) of one box."""

    def __init__(self, layout: Layout, name: str) -> None:
        self.layout = layout
        self.name = name
        self.dirs = {ctrl: os.path.join(parent, name) for ctrl, parent in layout.parents.items()}
        self._oom = OomCounter(os.path.join(self.dirs["memory"], "memory.oom_control") if layout.version == 1
                               else os.path.join(self.dirs[""], "memory.events"))

    @classmethod
    def create(cls, name: str, limits: Limits, layout: Layout | None = None) -> BoxCgroup:
        cg = cls(layout or detect(), name)
        try:
            for d in cg.dirs.values():
                os.mkdir(d)
            cg._apply(limits)
        except OSError:
            cg.remove()
            raise
        return cg

    def _apply(self, lim: Limits) -> None:
        quota = max(1000, int(lim.cpus * CFS_PERIOD_US))
        if self.layout.version == 1:
            mem = self.dirs["memory"]
            _write(os.path.join(mem, "memory.limit_in_bytes"), str(lim.memory_bytes))
            memsw = os.path.join(mem, "memory.memsw.limit_in_bytes")
            if os.path.exists(memsw):  # swap accounting on: no escaping the limit into swap
                _write(memsw, str(lim.memory_bytes))
            swappiness = os.path.join(mem, "memory.swappiness")
            if os.path.exists(swappiness):
                try:
                    _write(swappiness, "0")
                except OSError:
                    pass
            _write(os.path.join(self.dirs["pids"], "pids.max"), str(lim.pids))
            _write(os.path.join(self.dirs["cpu"], "cpu.cfs_period_us"), str(CFS_PERIOD_US))
            _write(os.path.join(self.dirs["cpu"], "cpu.cfs_quota_us"), str(quota))
        else:
            d = self.dirs[""]
            _write(os.path.join(d, "memory.max"), str(lim.memory_bytes))
            if os.path.exists(os.path.join(d, "memory.swap.max")):
                _write(os.path.join(d, "memory.swap.max"), "0")
            _write(os.path.join(d, "pids.max"), str(lim.pids))
            _write(os.path.join(d, "cpu.max"), f"{quota} {CFS_PERIOD_US}")

    def set_background(self, on: bool) -> None:
        """A warm-pool box starts at a low CPU weight, so its start-up (interpreter, imports) gives
        way to boxes that are serving runs; it gets the normal weight when it is handed out."""
        if self.layout.version == 1:
            _write(os.path.join(self.dirs["cpu"], "cpu.shares"), str(BACKGROUND_SHARES if on else 1024))
        else:
            _write(os.path.join(self.dirs[""], "cpu.weight"), str(BACKGROUND_WEIGHT if on else 100))

    def procs_files(self) -> list[str]:
        """The files a starting process writes its pid into to join every controller."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def join(self, pid: int = 0) -> None:
        """Move ``pid`` (0 = the caller) into the box's cgroups. Safe to call after fork()."""
        value = str(pid or os.getpid()).encode()
        for path in self.procs_files():
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, value)
            finally:
                os.close(fd)

    def pids(self) -> list[int]:
        d = self.dirs.get("pids") or self.dirs.get("memory") or self.dirs.get("")
        try:
            return [int(p) for p in _read(os.path.join(d, "cgroup.procs")).split()]
        except OSError:
            return []

    def oom_kills(self) -> int:
        """OOM kills inside this box so far (boxes/oom_counter.py: one pread per read)."""
        text = self._oom.read_text()
        if text is None:
            return 0
        count = parse_oom_kills(text)
        if count is not None:
            return count
        if self.layout.version == 1:  # old kernels without the oom_kill counter
            try:
                return 1 if int(_read(os.path.join(self.dirs["memory"], "memory.failcnt"))) else 0
            except (OSError, ValueError):
                return 0
        return 0

    def memory_current(self) -> int | None:
        name = "memory.usage_in_bytes" if self.layout.version == 1 else "memory.current"
        d = self.dirs.get("memory") or self.dirs.get("")
        try:
            return int(_read(os.path.join(d, name)))
        except (OSError, ValueError, TypeError):
            return None

    def kill_all(self, deadline: float = 5.0) -> list[int]:
        """SIGKILL every process in the box until none is left; return the pids still alive."""
        if self.layout.version == 2:
            kill_file = os.path.join(self.dirs[""], "cgroup.kill")
            if os.path.exists(kill_file):
                try:
                    _write(kill_file, "1")
                except OSError:
                    pass
        freezer = self.dirs.get("freezer")
        end = time.monotonic() + deadline
        while True:
            if freezer:  # frozen processes cannot fork while we kill them
                try:
                    _write(os.path.join(freezer, "freezer.state"), "FROZEN")
                except OSError:
                    freezer = None
            pids = self.pids()
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if freezer:
                try:
                    _write(os.path.join(freezer, "freezer.state"), "THAWED")
                except OSError:
                    pass
            if not pids:
                return []
            if time.monotonic() > end:
                return self.pids()
            time.sleep(0.005)

    def remove(self, deadline: float = 5.0) -> bool:
        """rmdir every cgroup of the box (retrying while the last processes exit)."""
        self._oom.close()
        end = time.monotonic() + deadline
        ok = True
        for d in self.dirs.values():
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY or time.monotonic() > end:
                        ok = False
                        break
                    time.sleep(0.01)
        return ok

    def exists(self) -> bool:
        return any(os.path.isdir(d) for d in self.dirs.values())
