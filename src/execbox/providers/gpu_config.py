"""The GPU opt-in's provider config fields, shared by the jail and Docker providers."""

from __future__ import annotations

from typing import Any

from ..boxes import gpu
from ..errors import InvalidConfigError

GPU_SCHEMA: dict[str, dict[str, Any]] = {
    "gpu": {"type": "string", "default": "off", "label": "GPUs per box",
            "placeholder": "off",
            "description": "NVIDIA GPU passthrough, off by default: 'all' or device indices such as '0,1'. "
                           "A session asking where the host has no such GPU fails with SB002."},
    "gpu_tenant_cap": {"type": "string", "default": "", "label": "GPU cap per tenant",
                       "placeholder": "1 or acme=2,*=1",
                       "description": "Most GPUs one tenant's live sessions may hold together: N for every "
                                      "tenant, or TENANT=N pairs with '*' as the default. Empty: no cap. "
                                      "A session past the cap fails with SB008."},
}


def gpu_config_error(config: dict[str, Any]) -> tuple[bool, str | None]:
    """(ok, message) for ``validate_config``: the values' syntax (host facts are checked later)."""
    try:
        gpu.parse_gpu(config.get("gpu"))
        gpu.parse_tenant_cap(config.get("gpu_tenant_cap"))
    except InvalidConfigError as e:
        return False, e.message
    return True, None


def legacy_gpu(config: dict[str, Any] | None) -> dict[str, Any]:
    """A stored boolean ``gpu`` (the Docker provider's field before it took indices): true = all."""
    config = dict(config or {})
    if isinstance(config.get("gpu"), bool):
        config["gpu"] = "all" if config["gpu"] else "off"
    return config


def runsc_has_nvproxy(docker_info: dict[str, Any], runtime: str) -> bool:
    entry = (docker_info.get("Runtimes") or {}).get(runtime) or {}
    args = entry.get("runtimeArgs") or entry.get("RuntimeArgs") or []
    return any(a in ("--nvproxy", "--nvproxy=true", "-nvproxy") for a in args)


def docker_gpu_plan(config: dict[str, Any], runtime: str, docker_info: dict[str, Any],
                    local_engine: bool, dev_root: str = "/dev") -> gpu.GpuPlan:
    """The Docker provider's GPU plan: host devices (local engine only) and, under gVisor, nvproxy."""
    plan = gpu.GpuPlan(config, dev_root)
    if not plan.enabled:
        return plan
    if not local_engine:  # a remote engine's devices are not ours to list: trust its answer
        plan.error = None
        plan.indices = list(plan.request.indices) if plan.request and not plan.request.all else []
    if plan.error is None and (runtime.startswith("runsc") or "gvisor" in runtime) \
            and not runsc_has_nvproxy(docker_info, runtime):
        plan.error = InvalidConfigError(
            f"gpu with runtime {runtime!r} needs gVisor's nvproxy: add \"--nvproxy\" to that runtime's "
            "runtimeArgs in /etc/docker/daemon.json (and reload dockerd with SIGHUP), or use runtime runc",
            details={"field": "gpu", "runtime": runtime, "missing": "--nvproxy"})
    return plan


def docker_device_ids(plan: gpu.GpuPlan) -> list[str] | None:
    """None = every GPU (``--gpus all``); else the selected indices as Docker device ids."""
    if plan.request is None or plan.request.all:
        return None
    return [str(i) for i in (plan.indices or plan.request.indices)]
