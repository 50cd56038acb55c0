"""Provider ``docker``: hardened containers (tier ``gvisor`` under runsc, ``container`` under runc).

Each box is a container whose main process is the execbox agent (see boxes/docker_box.py); a warm
pool keeps ``pool_size`` of them started so create_instance never cold-starts on the hot path,
and waits a bounded time for one when the pool is drained (SB004 with the pool's state after).
Containers and volumes carry an ``execbox.owner`` label so a restarted service removes what a
dead predecessor left behind.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..boxes import quota
from ..boxes.docker_box import ContainerSpec, DockerBox, start_container
from ..boxes.docker_host import HostSide
from ..boxes.docker_owner import (
    OWNER_LABEL,
    owner_id,
    owner_is_gone,
    safe_name,
)
from ..boxes.docker_removals import Removals, engine_down, engine_unavailable, engine_unreachable
from ..boxes.gpu import GpuPlan, parse_gpu
from ..boxes.oci_seccomp import is_gvisor
from ..boxes.pool import BoxPool
from ..egress.policy import EgressPolicy, parse_policy
from ..egress.schema import check_network_config, policy_from_config
from ..errors import (
    BoxStartFailed,
    InstanceCreationError,
    SandboxError,
)
from ..models import Isolation, SandboxInstance, make_instance_id
from .agent_backed import AgentBackedProvider, Instance, box_start_failed, tenant_pool_view
from .docker_config import (
    config_schema,
    docker_client,
    docker_host_problem,
    engine_availability,
    host_checks,
    runsc_host_pids,
)
from .docker_hygiene import PROVIDER_LABEL, DockerHygieneMixin
from .docker_prepare import NET_RUNTIME, DockerPrepareMixin
from .docker_sessions import DockerSessionsMixin, workspace_still_held
from .docker_spares import DockerSparesMixin
from .gpu_config import docker_device_ids, gpu_config_error, legacy_gpu
from .schema import parse_size

log = logging.getLogger("execbox.provider.docker")

__all__ = ["DockerProvider", "docker_client", "owner_id", "owner_is_gone", "runsc_host_pids"]


class DockerProvider(DockerPrepareMixin, DockerSessionsMixin, DockerSparesMixin, DockerHygieneMixin,
                     AgentBackedProvider):
    name = "docker"
    display_name = "Docker (gVisor)"
    description = ("Hardened containers from a warm pool: gVisor (runsc) when registered with the "
                   "Docker engine, else runc.")
    tags = ["self-hosted", "container", "gvisor"]
    isolation = Isolation.GVISOR  # the class tier; an initialized runc provider reports "container"
    zero_config = False  # needs a daemon and a built image: chosen explicitly, never by zero-config

    def __init__(self) -> None:
        super().__init__()
        self.docker: Any = None
        self.runtime = ""
        self.owner = owner_id()
        self.uid = uuid.uuid4().hex
        self._notes: list[str] = []
        self._gpu: GpuPlan | None = None
        self._preload = "auto"  # the config's preload as boxes get it (docker_config.effective_preload)
        self._masked: list[str] | None = None  # runc: the boxes' MaskedPaths (boxes/docker_masks.py)
        self._reaper: ThreadPoolExecutor | None = None
        self._warmer: ThreadPoolExecutor | None = None
        self._warm_lock = threading.Lock()
        self._warm_seq = 0
        self._pending = 0
        self._pending_lock = threading.Condition()
        self._kept: set[str] = set()  # session containers detached at shutdown, left running
        self.engine_id = ""  # names this engine in host dirs and uid pins (docker_uid.engine_key)
        self._removals: Removals | None = None  # removals retried until the engine lets them
        self._pinger: Any = None  # a client with a short timeout, for _engine_answers (made by prepare)
        self.live_restore = False  # the engine's LiveRestoreEnabled: its restarts leave containers running

    @staticmethod
    def get_config_schema() -> dict[str, dict[str, Any]]:
        return config_schema()

    def validate_config(self, config: dict[str, Any]) -> tuple[bool, str | None]:
        try:
            parse_size(config.get("max_memory") or "512m")
        except ValueError as e:
            return False, f"max_memory: {e}"
        problem = docker_host_problem(config.get("docker_host"))
        if problem:
            return False, problem
        ok, message = gpu_config_error(config)
        if not ok:
            return ok, message
        return check_network_config(config)

    def initialize(self, config: dict[str, Any]) -> bool:
        config = legacy_gpu(config)  # a stored boolean gpu keeps working
        if isinstance(config.get("network"), bool):  # before issue 14: a bool (true = a bridge)
            config["network"] = "open" if config["network"] else "none"
        return super().initialize(config)

    # -- host facts -------------------------------------------------------------------------
    @classmethod
    def availability(cls) -> tuple[bool, str]:
        """dockerd answers, runsc is registered and the default image exists (cached per process)."""
        return engine_availability()

    @classmethod
    def diagnose(cls) -> dict[str, dict[str, Any]]:
        """Host facts `execbox doctor` prints: the boxes' host uids and their workspace limit."""
        return host_checks()

    def health_check(self) -> bool:
        """This configuration's engine answers (the class probe also demands runsc and the default image)."""
        if not self.initialized or self.docker is None:
            return False
        try:
            return bool(self.docker.ping())
        except Exception:  # noqa: BLE001
            return False

    # -- lifecycle: prepare() is DockerPrepareMixin's (docker_prepare.py) -----------------------
    def admit(self, tenant_id: str) -> None:
        if self._gpu is not None:
            self._gpu.admit(tenant_id, self.tenant_boxes(tenant_id))

    @property
    def network_enabled(self) -> bool:
        return self.egress_cap.mode != "none"

    def _egress_policy(self) -> EgressPolicy:
        """The provider's network policy; GPU containers stay offline unless gpu_network is set."""
        c = self.config
        policy = policy_from_config(c)
        if parse_gpu(c.get("gpu")) is not None:
            if not c.get("gpu_network"):
                return EgressPolicy()
            if policy.mode == "none":
                return parse_policy("open")
        return policy

    def warnings(self) -> list[str]:
        return list(self._notes)

    def applied_limits(self) -> dict[str, Any]:
        c = self.config
        return {**super().applied_limits(), "max_memory": c.get("max_memory"), "cpus": c.get("cpus"),
                "pids_limit": c.get("pids_limit"), "network": self.egress_cap.mode, "runtime": self.runtime,
                "disk_quota_mb": self.disk_bytes() // (1024 * 1024),
                "gpu": self._gpu.describe() if self._gpu else "off", "enforced_by": f"docker/{self.runtime}"}

    def pool_status(self) -> dict[str, Any] | None:
        status = super().pool_status()
        if status is not None:
            status.update({"image": self.config.get("image"), "runtime": self.runtime,
                           "wait_seconds": self.config.get("pool_wait")})
        return status

    # -- boxes ------------------------------------------------------------------------------
    def disk_bytes(self) -> int:
        """The /workspace size limit (the jail's ``disk_quota_mb``)."""
        return int(self.config.get("disk_quota_mb") or 512) * 1024 * 1024

    def container_spec(self, *, tenant_id: str = "", session_id: str = "", instance_id: str = "",
                       labels: dict[str, str] | None = None, image: str | None = None,
                       host: HostSide | None = None) -> ContainerSpec:
        """What a box is created with; ``host`` (docker_host.HostSide) gives its uid and /workspace
        (without one, as for a non-root service's pool box: SANDBOX_UID and a tmpfs)."""
        c = self.config
        host = host or HostSide(None, None, tmpfs_bytes=self.disk_bytes())
        memory = parse_size(c["max_memory"])
        short = uuid.uuid4().hex[:12]
        labels = {"execbox.tenant": tenant_id, "execbox.session": session_id, "execbox.instance": instance_id,
                  "execbox.pooled": "false" if instance_id else "true", OWNER_LABEL: self.owner,
                  PROVIDER_LABEL: self.uid, **host.labels(), **(labels or {})}
        # The agent's per-run data limit sits below the cgroup limit, so most bombs end in a clean
        # MemoryError (SB006) instead of a cgroup OOM kill; the cgroup stays the hard backstop.
        agent_limits = {"memory_bytes": int(memory * 0.8), "fsize_bytes": 256 * 1024**2, "nofile": 1024}
        pids = int(c["pids_limit"])
        if self.runtime == "runsc":
            # gVisor's own threads live in the container's host cgroup: give them headroom there and
            # enforce the user-facing limit inside the sandbox (gVisor's per-sandbox RLIMIT_NPROC).
            # Not under runc: RLIMIT_NPROC counts the uid across the whole host.
            agent_limits["nproc"] = pids
            pids = runsc_host_pids(pids)
        return ContainerSpec(
            image=image or c["image"], runtime=NET_RUNTIME if self.runtime == "runsc" and self.network_enabled
            else self.runtime, name=safe_name("execbox", tenant_id, session_id, short),
            labels=labels, memory_bytes=memory, cpus=float(c["cpus"]), pids_limit=pids,
            egress=self.egress_cap, gpu=bool(self._gpu and self._gpu.enabled),
            gpu_ids=docker_device_ids(self._gpu) if self._gpu else None,
            host_workspace=host.bind, workspace_tmpfs=0 if host.bind else host.tmpfs_bytes, run_as=host.uid,
            nss=dict(host.nss), preload=self._preload, agent_limits=agent_limits,
            pts_host=host.pts, masked_paths=self._masked,
        )

    def start_box(self, workspace: str | None = None, labels: dict[str, str] | None = None,
                  image: str | None = None, **ids: str) -> DockerBox:
        if workspace is not None:
            self._settle_workspace(workspace)
        # runc: a capped devpts of the box's own (runsc's sentry has its own, drawing on no host pty)
        host = HostSide.prepare(workspace, self.disk_bytes(), ptys=not is_gvisor(self.runtime),
                                engine=self.engine_id)
        try:
            spec = self.container_spec(labels=labels, image=image, host=host, **ids)
        except BaseException:
            host.release()
            raise
        box = start_container(self.docker, spec, host, removals=self._removals)
        box.remover = self._remove_later
        box.removals = self._removals
        if workspace is None and not ids:  # a pool box: worth preparing off the hot path
            try:
                self._prewarm(box)
            except BaseException:
                box.destroy()
                raise
        return box

    def _remove_later(self, job: Any) -> None:
        reaper = self._reaper
        if reaper is None:
            job()
            return
        with self._pending_lock:
            self._pending += 1

        def run() -> None:
            try:
                job()
            finally:
                with self._pending_lock:
                    self._pending -= 1
                    self._pending_lock.notify_all()

        try:
            reaper.submit(run)
        except RuntimeError:  # reaper already shut down
            run()

    def create_instance(self, template: str = "python", *, tenant_id: str = "default",
                        session_id: str | None = None, workspace: str | None = None,
                        labels: dict[str, str] | None = None, runtime: str | None = None) -> SandboxInstance:
        """A pooled container (waiting up to ``pool_wait`` s); a cold start only without a pool, or
        with ``runtime`` (a runtime template built with ``--docker``: its image)."""
        self._require_initialized()
        with self.admitted(tenant_id):
            return self._create_admitted_container(tenant_id, session_id, workspace, labels, runtime)

    def _create_admitted_container(self, tenant_id: str, session_id: str | None, workspace: str | None,
                                   labels: dict[str, str] | None, runtime: str | None) -> SandboxInstance:
        if self._pool is None or workspace is not None or runtime:
            instance_id = make_instance_id(tenant_id, session_id)
            try:
                image, runtime = runtime_image(self.docker, runtime) if runtime else (None, None)
                box = self.start_box(workspace, labels=labels if workspace is not None else None, image=image,
                                     tenant_id=tenant_id, session_id=session_id or "", instance_id=instance_id)
            except SandboxError:
                raise
            except quota.StillMounted:
                pass  # SB009 below, outside this block (no chain: its own words, not the session layer's)
            except Exception as e:  # noqa: BLE001
                if engine_unreachable(e):
                    log.warning("docker: could not start a container: %s", e)
                    raise engine_unavailable(self.name) from e
                raise box_start_failed(self.name, e, "a container") from e
            else:
                return self._register(Instance(instance_id, box, tenant_id, session_id, runtime=runtime),
                                      workspace is not None)
            raise workspace_still_held(self.name, session_id)
        wait, pool, since = float(self.config.get("pool_wait") or 0), self._pool, time.time()
        if not pool.status()["ready"] and engine_down(pool, 0.0) and not self._engine_answers():
            raise engine_unavailable(self.name)  # the refill keeps failing: no use waiting pool_wait
        box = pool.take(wait, give_up=lambda: engine_down(pool, since))
        if box is None:
            if engine_down(pool, since):
                raise engine_unavailable(self.name)
            raise self._no_pooled_box(pool, wait)
        instance_id = make_instance_id(tenant_id, session_id)
        assert isinstance(box, DockerBox)
        self._claim_later(box, tenant_id, session_id or "", instance_id)
        return self._register(Instance(instance_id, box, tenant_id, session_id, from_pool=True), False)

    def _engine_answers(self) -> bool:
        """A ping with a short timeout of its own (a hung engine must not hold a request for the
        client's 30 s)."""
        if self._pinger is None:  # shut down
            return True
        try:
            self._pinger.api.ping()
        except Exception as e:  # noqa: BLE001
            return not engine_unreachable(e)
        return True

    def _no_pooled_box(self, pool: BoxPool, wait: float) -> InstanceCreationError:
        """SB004 for a caller the pool had no container for within ``wait`` s: every pooled one is
        in use, or the pool fails to start them (the tenant reads that failure cut by tenant_safe)."""
        view = tenant_pool_view(pool)  # (a past failure stays in last_error: cut there too)
        head = f"docker: no container available within {wait:g}s"
        if view["healthy"] or pool.last_exception is None:
            return InstanceCreationError(
                f"{head}; all {view['size']} pooled containers are in use ({view['starting']} starting)",
                details={"provider": self.name, "pool": view})
        whole = pool.last_error
        log.warning("docker: no pooled container for a caller; the pool's last start failure: %s", whole)
        return BoxStartFailed(f"{head}; pool failing to start containers: {view['last_error']}", whole,
                              details={"provider": self.name, "pool": view})

    def _register(self, inst: Instance, keep_workspace: bool) -> SandboxInstance:
        inst.box.keep_workspace = keep_workspace
        self._recoverable(inst.box)  # docker_sessions.py: re-attached when its stream ends
        self._bind_egress(inst)
        with self._lock:
            self._instances[inst.instance_id] = inst
        return SandboxInstance(inst.instance_id, self.name, "running", self._instance_metadata(inst))

    def _claim_later(self, box: DockerBox, tenant: str, session: str, instance_id: str) -> None:
        """Name a pooled container after its owner (labels are fixed at create; names are not)."""
        new_name = safe_name("execbox", tenant, session, instance_id.rsplit(":", 1)[-1][:12])
        box.claimed_by = {"tenant": tenant, "session": session, "instance": instance_id}

        def rename() -> None:
            if box.destroyed:
                return
            try:
                self.docker.api.rename(box.container_id, new_name)
                box.name = new_name
            except Exception:  # noqa: BLE001 - removed meanwhile: nothing to name
                pass

        self._remove_later(rename)

    def _instance_metadata(self, inst: Instance) -> dict[str, Any]:
        meta = super()._instance_metadata(inst)
        meta["workspace"] = inst.box.workspace or "/workspace"
        if inst.runtime:
            meta["runtime"] = inst.runtime
        return meta

    def shutdown(self) -> None:
        pool = self._pool
        if self._warmer is not None:
            self._warmer.shutdown(wait=False, cancel_futures=True)
            self._warmer = None
        super().shutdown()
        if pool is not None:
            pool.join(timeout=90)  # a start in flight ends in destroy()
        with self._pending_lock:
            self._pending_lock.wait_for(lambda: self._pending == 0, timeout=60)
        if self._reaper is not None:
            self._reaper.shutdown(wait=True)
            self._reaper = None
        if self._removals is not None:
            self._removals.close()  # one last try of what failed; the next start sweeps the rest
        if self.docker is not None:
            self.remove_leftovers()
            self.docker.close()
            self.docker = None
        if self._pinger is not None:
            self._pinger.close()
            self._pinger = None


def runtime_image(client: Any, name: str) -> tuple[str, str]:
    """(image, NAME@vN) of runtime template ``name``; SB002 naming it when unknown or built
    without ``--docker``. Resolved once, so a session keeps the version it started with."""
    from ..boxes import runtime as rt
    from ..boxes.runtime_docker import image_for

    r = rt.resolve_runtime(name)
    return image_for(client, r), r.ref
