"""Provider ``jail`` (isolation tier ``jail``): execbox's default backend, no daemon needed.

One box per instance: bubblewrap namespaces (user, pid, net, ipc, uts, mount, cgroup), a
read-only system and runtime, a quota-limited private workspace, a seccomp filter, a cgroup
with memory/pids/CPU limits, an unprivileged uid and an environment built from scratch. The
execbox agent runs as the box's main process; everything about running code is shared with
the other self-hosted backends (providers/agent_backed.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Any

from ..boxes import (
    bwrap,
    cgroups,
    gpu,
    host_tables,
    jail_net,
    netns,
    quota,
    runtime,
    seccomp,
    staged_leases,
    staging,
    uids,
)
from ..boxes.jail_box import JailBox, JailSettings, drain, host_uid, reap_stale
from ..boxes.jail_box import start as start_jail_box
from ..egress.schema import NETWORK_SCHEMA, check_network_config, policy_from_config
from ..errors import InvalidConfigError, ProviderNotInitializedError, ProviderUnavailableError
from ..models import Isolation
from .agent_backed import POLICY_SCHEMA, TIMEOUT_SCHEMA, AgentBackedProvider, tenant_pool_view
from .gpu_config import GPU_SCHEMA, gpu_config_error
from .jail_checks import trial_box as _trial_box
from .jail_checks import uid_range_check as _uid_range_check
from .jail_checks import userns_check as _userns_check
from .schema import parse_size

log = logging.getLogger("execbox.jail")
TMP_MAX = 256 * 1024 * 1024

_avail_lock = threading.Lock()
_avail: tuple[bool, str] | None = None
_avail_at = 0.0
AVAIL_RECHECK = 30.0
POOL_JOIN = 60.0  # seconds shutdown waits for a pool box start in flight (a start takes well under 1 s)


class JailProvider(AgentBackedProvider):
    name = "jail"
    display_name = "Local jail (bubblewrap)"
    description = ("Each instance runs in a bubblewrap box on this host: namespaces, seccomp, cgroup limits, "
                   "network only through the egress gateway when a policy allows it, a quota-limited "
                   "workspace. No daemon needed.")
    tags = ["self-hosted", "default", "no-daemon"]
    isolation = Isolation.JAIL
    zero_config = True
    warm_pool_wait = 0.0

    def __init__(self) -> None:
        super().__init__()
        self._settings: JailSettings | None = None
        self._runtime_ref: str | None = None  # the configured runtime, resolved at each box start
        self._gpu: gpu.GpuPlan | None = None
        self._warnings: list[str] = []

    @staticmethod
    def get_config_schema() -> dict[str, dict[str, Any]]:
        return {
            **TIMEOUT_SCHEMA,
            "max_memory": {"type": "string", "default": "512m", "format": "size", "label": "Memory per box",
                           "description": "cgroup memory limit of each box (e.g. 256m, 1g); exceeding it is SB006."},
            "cpus": {"type": "number", "default": 1.0, "min": 0.05, "max": 64, "label": "CPUs per box",
                     "description": "CPU bandwidth of each box in cores (cgroup CFS quota)."},
            "pids_limit": {"type": "integer", "default": 128, "min": 8, "max": 32768, "label": "Processes per box",
                           "description": "cgroup pids limit: a fork bomb stops here."},
            "require_cgroups": {"type": "boolean", "default": False, "label": "Require cgroup limits",
                                "description": "Refuse to start (SB009) where this host gives execbox no cgroup "
                                               "for memory, pids and cpu, instead of running boxes degraded "
                                               "(per-process rlimits only; docs/cgroup-v2.md)."},
            "disk_quota_mb": {"type": "integer", "default": 512, "min": 8, "max": 1048576,
                              "label": "Workspace quota (MB)",
                              "description": "Size of each box's workspace; writing past it fails (507)."},
            "oneshot_workspace": {"type": "string", "default": "tmpfs", "options": ["tmpfs", "disk"],
                                  "label": "One-shot workspace",
                                  "description": "Where a one-shot run's workspace lives when no pooled box is "
                                                 "ready: 'tmpfs' (in memory, capped at the quota, counted against "
                                                 "max_memory like /tmp; no image to attach, mount and remove) or "
                                                 "'disk' (an ext4 image of the quota, like a session's)."},
            "pool_size": {"type": "integer", "default": 2, "min": 0, "max": 64, "label": "Warm pool size",
                          "description": "Boxes started ahead of time so one-shot runs skip start-up."},
            "pool_sessions": {"type": "boolean", "default": True, "label": "Sessions from the warm pool",
                              "description": "A new session's box is a warm pooled box whose workspace image "
                                             "becomes the session's (create without a box start); a "
                                             "session whose directory is not empty or on another "
                                             "filesystem gets a cold box as before."},
            "runtime": {"type": "string", "default": "system", "label": "Python runtime",
                        "placeholder": "system",
                        "description": "'system' (host python3 standard library) or a runtime template "
                                       "made by `execbox runtime build NAME --pip PKG --npm PKG` (NAME = its "
                                       "current version, NAME@vN = one version)."},
            "preload": {"type": "string", "default": "auto", "label": "Preload modules",
                        "description": "'auto' (numpy, pandas, matplotlib when the runtime has them), "
                                       "'none', or a comma-separated list in which 'auto' may be one "
                                       "entry ('auto,torch')."},
            "max_output_bytes": {"type": "integer", "default": 1048576, "min": 1024, "max": 64 * 1048576,
                                 "label": "Output cap (bytes)", "description": "Cap on stdout and stderr each."},
            **POLICY_SCHEMA,
            **GPU_SCHEMA,
            **NETWORK_SCHEMA,
        }

    def validate_config(self, config: dict[str, Any]) -> tuple[bool, str | None]:
        try:
            mem = parse_size(config.get("max_memory") or "512m")
        except ValueError as e:
            return False, f"max_memory: {e}"
        if mem < 32 * 1024 * 1024:
            return False, "max_memory: must be at least 32m (the agent itself needs ~15 MB)"
        try:
            runtime.resolve(config.get("runtime"), list_known=True)  # the operator's config
        except runtime.RuntimeNotUsable as e:
            return False, f"runtime: {e.message}"
        ok, message = gpu_config_error(config)
        if not ok:
            return ok, message
        return check_network_config(config)

    # -- lifecycle --------------------------------------------------------------------------
    def prepare(self) -> None:
        if os.geteuid() == 0:
            host_uid()  # a bad EXECBOX_JAIL_HOST_UID is a configuration error (SB002), not "unavailable"
        ok, reason = self.availability()
        if not ok:
            raise ProviderUnavailableError(f"jail provider cannot run on this host: {reason}",
                                           details={"provider": self.name, "reason": reason})
        cfg = self.config
        self._runtime_ref = cfg.get("runtime") or None
        rt = runtime.resolve(self._runtime_ref, list_known=True)
        _reap_once()
        self._warnings = []
        use_cgroups = True
        try:
            cgroups.detect()
        except cgroups.CgroupUnavailable as e:
            if cfg.get("require_cgroups"):
                raise ProviderUnavailableError(
                    f"jail provider: require_cgroups is set and this host gives boxes no cgroup limits ({e})",
                    details={"provider": self.name, "reason": f"cgroups: {e}", "missing": "cgroup limits"}) from None
            use_cgroups = False
            self._warnings.append(f"jail: no cgroup limits ({e}); memory is bounded by rlimits only and "
                                  "destroy relies on the pid namespace (require_cgroups: true refuses instead)")
        if use_cgroups:  # a box's open files and ptys are then charged to its memory cgroup
            host_tables.raise_once()
        disk = int(cfg.get("disk_quota_mb") or 512) * 1024 * 1024
        if not quota.loop_quota_possible()[0]:
            self._warnings.append("jail: workspace quota is a tmpfs inside the box; its contents count "
                                  "against max_memory")
        self._gpu = self._gpu_plan()
        self._settings = JailSettings(
            device_args=self._gpu_device_args(),
            runtime=rt, memory_bytes=parse_size(cfg.get("max_memory") or "512m"), cpus=float(cfg.get("cpus") or 1),
            pids=int(cfg.get("pids_limit") or 128), disk_bytes=disk, tmp_bytes=min(TMP_MAX, disk),
            preload=str(cfg.get("preload") or "auto"), use_cgroups=use_cgroups,
            agent_root=staging.staged_agent(),
            egress=policy_from_config(cfg),
        )
        _sweep_staged_once()  # after staged_agent(): the current agent copy is leased
        self.egress_cap = self._settings.egress

    # -- GPU opt-in (boxes/gpu.py) ----------------------------------------------------------------
    def _gpu_plan(self) -> gpu.GpuPlan:
        plan = gpu.GpuPlan(self.config, os.environ.get("EXECBOX_GPU_DEV_ROOT", "/dev"))
        if plan.error is not None:
            self._warnings.append(f"jail: {plan.error}; sessions fail with SB002 until this is fixed")
        return plan

    def _gpu_device_args(self) -> list[str]:
        plan = self._gpu
        if plan is None or not plan.indices:
            return []
        return gpu.jail_args(plan.indices, plan.inventory, gpu.driver_files())

    def admit(self, tenant_id: str) -> None:
        if self._gpu is not None:
            self._gpu.admit(tenant_id, self.tenant_boxes(tenant_id))

    def _jail_settings(self, runtime_name: str | None = None) -> JailSettings:
        if self._settings is None:
            raise ProviderNotInitializedError("jail provider is not initialized; call initialize(config) first",
                                              details={"provider": self.name})
        if runtime_name is None:  # the configured one as it is now: NAME follows its current version
            now = runtime.resolve_runtime(self._runtime_ref)  # SB002 once it was removed
            if now != self._settings.runtime:
                self._settings = dataclasses.replace(self._settings, runtime=now)
            return self._settings
        return dataclasses.replace(self._settings, runtime=runtime.resolve_runtime(runtime_name))  # SB002 if unknown

    def pool_box_stale(self, box: Any) -> bool:
        """A ready pooled box no longer runs what the configured runtime means (``current`` of its
        template moved, or its version was removed): the pool drops it and starts a new one."""
        have = getattr(box, "runtime", None)
        return have is not None and not runtime.still_current(self._runtime_ref, have)

    def start_box(self, workspace: str | None = None, background: bool = False) -> JailBox:
        return start_jail_box(self._jail_settings(), workspace, background)

    def start_oneshot_box(self, runtime_name: str | None = None) -> JailBox:
        return start_jail_box(self._jail_settings(runtime_name), None,
                              tmpfs_workspace=self.config.get("oneshot_workspace") != "disk", oneshot=True)

    def start_pooled_box(self) -> JailBox:
        return self.start_box(background=True)

    def can_adopt_workspace(self, workspace: str) -> bool:
        """A new session's empty workspace on the boxes' filesystem can take a warm pooled box."""
        from ..boxes import quota
        from ..boxes.jail_box import boxes_dir

        return bool(self.config.get("pool_sessions")) and quota.loop_quota_possible()[0] \
            and quota.dir_adoptable(workspace, boxes_dir())

    def start_box_with_runtime(self, workspace: str | None, runtime_name: str) -> JailBox:
        return start_jail_box(self._jail_settings(runtime_name), workspace)

    def shutdown(self) -> None:
        pool = self._pool
        super().shutdown()
        # A pool box still starting ends in destroy() once its start returns: wait for that, or a
        # box process outlived the provider (a service that exited left it behind).
        if pool is not None and not pool.join(timeout=POOL_JOIN):
            log.error("jail: a pool box start was still running %ss after shutdown", POOL_JOIN)
        if not drain():
            log.error("jail: some boxes were still being torn down at shutdown")

    def warnings(self) -> list[str]:
        return list(self._warnings)

    template_in_limits = True

    def applied_limits(self) -> dict[str, Any]:
        s = self._settings
        base = super().applied_limits()
        if s is None:
            return base
        return {**base, "max_memory": self.config.get("max_memory"), "cpus": s.cpus, "pids_limit": s.pids,
                "disk_quota_mb": s.disk_bytes // (1024 * 1024), "tmp_mb": s.tmp_bytes // (1024 * 1024),
                "oneshot_workspace": self.config.get("oneshot_workspace") or "tmpfs",
                "runtime": s.runtime.ref, "network": s.egress.mode,
                "gpu": self._gpu.describe() if self._gpu else "off",
                "enforced_by": "cgroup+rlimit" if s.use_cgroups else "rlimit"}

    def _instance_metadata(self, inst) -> dict[str, Any]:  # type: ignore[no-untyped-def]
        meta = super()._instance_metadata(inst)
        meta["runtime"] = self.runtime_ref(inst) or (self._settings.runtime.ref if self._settings else None)
        if self._pool is not None:
            pool = tenant_pool_view(self._pool)
            meta["pool"] = {k: pool[k] for k in ("size", "ready", "healthy", "last_error")}
        return meta

    # -- host facts -------------------------------------------------------------------------
    @classmethod
    def availability(cls) -> tuple[bool, str]:
        """bwrap present, seccomp filter buildable, a trivial box starts. A success is cached per
        process; a failure only for AVAIL_RECHECK seconds, since some are passing (every box uid in
        use, a trial box slow on a loaded host) and must not rule the jail out for good."""
        global _avail, _avail_at
        with _avail_lock:
            if _avail is None or (not _avail[0] and time.monotonic() - _avail_at > AVAIL_RECHECK):
                _avail, _avail_at = cls._probe(), time.monotonic()
            return _avail

    @classmethod
    def _probe(cls) -> tuple[bool, str]:
        checks = cls.diagnose()
        for key in ("bwrap", "seccomp", "user_namespaces", "host_uid", "trial_box"):
            c = checks[key]
            if not c["ok"]:
                return False, f"{key}: {c['detail']}"
        notes = [f"{k}: {checks[k]['detail']}" for k in ("cgroups", "workspace_quota") if not checks[k]["ok"]]
        return True, "ok" + (f" (degraded: {'; '.join(notes)})" if notes else "")

    @classmethod
    def diagnose(cls) -> dict[str, dict[str, Any]]:
        """Each prerequisite with ok and a human detail (printed by `execbox doctor`)."""
        out: dict[str, dict[str, Any]] = {}
        path = bwrap.bwrap_path()
        out["bwrap"] = {"ok": bool(path), "detail": path or "bubblewrap is not installed (apt install bubblewrap)"}
        try:
            seccomp.bpf_program()
            out["seccomp"] = {"ok": True, "detail": f"{len(seccomp.DENIED_SYSCALLS)} syscalls denied"}
        except seccomp.SeccompUnavailable as e:
            out["seccomp"] = {"ok": False, "detail": str(e)}
        out["user_namespaces"] = _userns_check()
        try:
            out["cgroups"] = {"ok": True, "detail": cgroups.detect().describe()}
        except cgroups.CgroupUnavailable as e:
            out["cgroups"] = {"ok": False, "detail": str(e)}
        ok, detail = quota.loop_quota_possible()
        out["workspace_quota"] = {"ok": ok, "detail": detail}
        ok, detail = netns.available()
        out["box_network"] = {"ok": ok, "detail": detail if not ok else
                              "network namespaces + iptables: network=allowlist|open possible (docs/network.md)"}
        try:
            out["runtime_system"] = {"ok": True, "detail": runtime.system_runtime().python}
        except runtime.RuntimeNotUsable as e:
            out["runtime_system"] = {"ok": False, "detail": e.message}
        try:
            names = [str(r["name"]) for r in runtime.list_runtimes()]
            out["runtimes"] = {"ok": True, "detail": ", ".join(names)}
        except (OSError, ValueError) as e:
            out["runtimes"] = {"ok": False, "detail": f"cannot list runtimes: {e}"}
        out["file_max"] = host_tables.file_max_check()
        if os.geteuid() == 0:  # per-box devpts caps (and uids) need root; without, bwrap's instances
            try:
                out["pty_max"] = host_tables.pty_max_check(uids.configured_range().count)
            except InvalidConfigError as e:
                out["pty_max"] = {"ok": False, "detail": e.message}
        try:
            out["host_uid"] = _uid_range_check()
        except InvalidConfigError as e:
            out["host_uid"] = {"ok": False, "detail": e.message}
        inv = gpu.inventory(os.environ.get("EXECBOX_GPU_DEV_ROOT", "/dev"))
        out["gpu"] = {"ok": True, "detail": (f"NVIDIA devices {inv.indices} (opt-in: provider config gpu)"
                                             if inv.indices else "no NVIDIA device (gpu opt-in: SB002)")}
        out["trial_box"] = _trial_box(path) if path and out["user_namespaces"]["ok"] else {
            "ok": False, "detail": "skipped: bwrap or user namespaces missing"}
        return out


_reaped = False


def _reap_once() -> None:
    """Once per process: remove boxes whose owning execbox process died (crash, SIGKILL)."""
    global _reaped
    with _avail_lock:
        if _reaped:
            return
        _reaped = True
    names = reap_stale()
    if os.geteuid() == 0:
        names += netns.reap_stale_once()
    if names:
        log.warning("jail: removed %d boxes left by dead execbox processes", len(names))


_swept = False


def _sweep_staged_once() -> None:
    """Once per process: remove staged /etc and agent copies that no live execbox process uses.

    A new one appears with every host change or upgrade (~300 KB and ~1 MB). This process
    leases the current ones first (the agent copy when ``initialize`` staged it, the /etc copies
    here), so only older ones can go (boxes/staged_leases.py).
    """
    global _swept
    with _avail_lock:
        if _swept:
            return
        _swept = True
    try:
        bwrap.staged_etc()
        jail_net.staged_etc_net()
        top = runtime.jail_dir()
        gone = staged_leases.sweep(top, lambda n: n.startswith("box-etc") and ".tmp-" in n)
        gone += staged_leases.sweep(os.path.join(top, "agent"), lambda n: n.startswith(".agent-"))
    except OSError as e:
        log.warning("jail: cannot sweep old staged directories: %s", e)
        return
    if gone:
        log.info("jail: removed %d staged directories no execbox process uses: %s",
                 len(gone), ", ".join(os.path.basename(g) for g in gone))
