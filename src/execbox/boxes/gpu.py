"""GPU passthrough (NVIDIA), opt-in per provider: parse the request, find the host's devices,
check a tenant's cap, and build what a jail box binds.

Off by default: a box without the opt-in gets no NVIDIA device node at all (the jail's /dev is
a fresh minimal tmpfs; containers get no device request). With ``gpu: all`` or ``gpu: 0,2`` every
box of the provider gets those devices:

* jail: the device nodes ``/dev/nvidia<N>`` plus the control nodes (``nvidiactl``, ``nvidia-uvm``,
  ...) are bound with ``--dev-bind`` (read-write: CUDA opens them O_RDWR, and bubblewrap's
  ``--remount-ro`` also sets nodev, which turned every open into EACCES on a real H100 host);
  the driver's user-space libraries (``libcuda``, ``libnvidia-*``) and ``nvidia-smi`` are bound
  read-only where the box does not already see them (the jail already binds the host's /usr
  read-only);
* Docker runc: a device request (NVIDIA Container Toolkit); runsc: the same request, served by
  gVisor's nvproxy, which the runtime must be registered with (``--nvproxy``).

Bad requests fail at session creation with an SB code, never inside the box: no NVIDIA device
on the host, an index the host lacks (SB002), more GPUs than the tenant's cap (SB008).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field

from ..errors import InvalidConfigError, RateLimitError

CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
LIB_GLOBS = ("libcuda.so*", "libnvidia-*.so*", "libnvcuvid.so*", "libcudadebugger.so*")
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
            "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/lib64", "/opt/nvidia/lib64")
BINARIES = ("nvidia-smi",)
ALREADY_IN_JAIL = ("/usr/",)  # the jail binds the host's /usr read-only already
_DEVICE = re.compile(r"^nvidia(\d+)$")
OFF = ("", "off", "none", "false", "no")
_DIGITS = re.compile(r"[0-9]+")  # str.isdigit() also takes "²" and "٣", which int() reads or refuses


@dataclass(frozen=True)
class GpuRequest:
    """``all`` or explicit device indices."""

    all: bool = False
    indices: tuple[int, ...] = ()

    def describe(self) -> str:
        return "all" if self.all else ",".join(map(str, self.indices))


def parse_gpu(value: object, field_name: str = "gpu") -> GpuRequest | None:
    """Provider config ``gpu``: off (default), ``all`` or comma-separated indices; else SB002."""
    if value is None or value is False:
        return None
    if value is True:
        return GpuRequest(all=True)
    text = str(value).strip().lower()
    if text in OFF:
        return None
    if text in ("all", "true", "yes", "on"):
        return GpuRequest(all=True)
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(_DIGITS.fullmatch(p) for p in parts):
        raise InvalidConfigError(f"{field_name}: {value!r} is not 'off', 'all' or device indices like '0,1'",
                                 details={"field": field_name, "value": str(value)})
    indices = tuple(sorted({int(p) for p in parts}))
    return GpuRequest(indices=indices)


def parse_tenant_cap(value: object, field_name: str = "gpu_tenant_cap") -> dict[str, int]:
    """``""`` (no cap), ``N`` (every tenant) or ``tenant=N,other=M,*=K``; else SB002."""
    text = str(value or "").strip()
    if not text:
        return {}
    caps: dict[str, int] = {}
    for item in text.split(","):
        name, sep, num = item.strip().rpartition("=")
        name = name.strip() if sep else "*"
        if not _DIGITS.fullmatch(num.strip()) or not name:
            raise InvalidConfigError(f"{field_name}: {item.strip()!r} is not N or TENANT=N",
                                     details={"field": field_name, "value": text})
        caps[name] = int(num)
    return caps


def cap_for(caps: dict[str, int], tenant: str) -> int | None:
    return caps.get(tenant, caps.get("*"))


@dataclass
class Inventory:
    """The NVIDIA device nodes a host has (``dev_root`` is /dev; tests point it elsewhere)."""

    dev_root: str = "/dev"
    indices: list[int] = field(default_factory=list)
    control: list[str] = field(default_factory=list)  # absolute paths that exist

    def node(self, index: int) -> str:
        return os.path.join(self.dev_root, f"nvidia{index}")


def inventory(dev_root: str = "/dev") -> Inventory:
    try:
        names = os.listdir(dev_root)
    except OSError:
        names = []
    indices = sorted(int(m.group(1)) for n in names if (m := _DEVICE.fullmatch(n)))
    control = [os.path.join(dev_root, n) for n in CONTROL_NODES if n in names]
    caps_dir = os.path.join(dev_root, "nvidia-caps")
    if os.path.isdir(caps_dir):
        control += sorted(os.path.join(caps_dir, n) for n in os.listdir(caps_dir))
    return Inventory(dev_root, indices, control)


def select(req: GpuRequest, inv: Inventory) -> list[int]:
    """The device indices a box gets; SB002 naming what is missing."""
    if not inv.indices:
        raise InvalidConfigError(
            f"gpu={req.describe()!r} but this host has no NVIDIA GPU (no {inv.dev_root}/nvidia[0-9]* device); "
            "turn the provider's gpu option off or run on a GPU host",
            details={"field": "gpu", "value": req.describe(), "missing": "NVIDIA device"})
    if req.all:
        return list(inv.indices)
    missing = [i for i in req.indices if i not in inv.indices]
    if missing:
        raise InvalidConfigError(
            f"gpu={req.describe()!r}: this host has no GPU {', '.join(map(str, missing))} "
            f"(it has {', '.join(map(str, inv.indices))})",
            details={"field": "gpu", "value": req.describe(), "missing": missing, "available": inv.indices})
    return list(req.indices)


def check_tenant_cap(caps: dict[str, int], tenant: str, per_box: int, held: int) -> None:
    """SB008 when a new box (``per_box`` GPUs) would take the tenant past its cap."""
    cap = cap_for(caps, tenant)
    if cap is None or held + per_box <= cap:
        return
    raise RateLimitError(
        f"tenant {tenant!r} may use {cap} GPU(s) at once; a new session needs {per_box} and {held} are in use",
        details={"field": "gpu_tenant_cap", "tenant": tenant, "cap": cap, "requested": per_box, "in_use": held})


def driver_files(lib_dirs: tuple[str, ...] = LIB_DIRS) -> list[str]:
    """The driver's user-space libraries and tools found on the host (real paths, deduplicated)."""
    found: dict[str, None] = {}
    for d in lib_dirs:
        for pattern in LIB_GLOBS:
            for p in sorted(glob.glob(os.path.join(d, pattern))):
                found[p] = None
    for name in BINARIES:
        for d in ("/usr/bin", "/usr/local/bin", "/usr/local/nvidia/bin"):
            p = os.path.join(d, name)
            if os.path.exists(p):
                found[p] = None
    return list(found)


def jail_args(indices: list[int], inv: Inventory, files: list[str]) -> list[str]:
    """bubblewrap arguments giving a box these GPUs (placed after ``--dev /dev``).

    Device nodes are bound read-write: a ``--remount-ro`` of the node would also mark it nodev
    (bubblewrap adds nodev to every remount it makes), so the box could not open it. The box's
    uid cannot change the node's owner or mode either way; what it gains is what the node's
    0666 gives every host user: I/O to the device."""
    args: list[str] = []
    nodes = [inv.node(i) for i in indices] + inv.control
    for host in nodes:
        dest = "/dev/" + os.path.relpath(host, inv.dev_root)
        args += ["--dev-bind", host, dest]
    for path in files:
        if not os.path.realpath(path).startswith(ALREADY_IN_JAIL):
            args += ["--ro-bind", path, path]
    return args


class GpuPlan:
    """A provider's GPU opt-in, resolved once against the host; checked per session.

    The host facts are looked up at provider start; ``admit`` raises the stored SB error at
    session creation (the provider itself still starts, so GPU-less sessions of a
    misconfigured host fail clearly instead of the whole provider being unavailable).
    """

    def __init__(self, config: dict, dev_root: str = "/dev") -> None:
        self.request = parse_gpu(config.get("gpu"))
        self.caps = parse_tenant_cap(config.get("gpu_tenant_cap"))
        self.indices: list[int] = []
        self.error: Exception | None = None
        self.inventory = inventory(dev_root) if self.request else Inventory(dev_root)
        if self.request is not None:
            try:
                self.indices = select(self.request, self.inventory)
            except InvalidConfigError as e:
                self.error = e

    @property
    def enabled(self) -> bool:
        return self.request is not None

    def admit(self, tenant: str, boxes_held: int) -> None:
        """Raise the SB error for this session, if any (no GPU / missing index / tenant cap)."""
        if self.request is None:
            return
        if self.error is not None:
            raise self.error
        check_tenant_cap(self.caps, tenant, len(self.indices), boxes_held * len(self.indices))

    def describe(self) -> str:
        if self.request is None:
            return "off"
        return f"{self.request.describe()} -> " + (",".join(map(str, self.indices)) if self.indices else "none")
