"""The Docker provider's start-up: what the engine must have before any box is made.

Split from docker.py (the provider's box lifecycle) along that seam: the engine reached and its
runtimes read, the runtime and isolation tier chosen, the image, the boxes' seccomp profile, GPU
plan and masked paths checked once, the removal and warm-up workers started, and what a dead
predecessor left behind swept. Every failure here is SB009/SB002 at initialize, not at a first run.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..boxes import docker_masks, docker_uid, host_tables, netns
from ..boxes.docker_owner import OWNER_LABEL
from ..boxes.docker_removals import Removals
from ..boxes.oci_seccomp import is_gvisor
from ..errors import InvalidConfigError, ProviderUnavailableError
from ..models import Isolation
from ..settings import parse_bool
from .docker_config import check_box_seccomp, docker_client, engine_error
from .docker_hygiene import PROVIDER_LABEL
from .gpu_config import docker_gpu_plan
from .preload import effective_preload
from .schema import parse_size

NET_RUNTIME = "runsc-net"  # runsc with the host stack inside the box's own, gateway-only namespace
PING_TIMEOUT = 2  # s: the check made before a one-shot waits for a pool whose refills fail
log = logging.getLogger("execbox.provider.docker")


class DockerPrepareMixin:
    """``prepare`` of DockerProvider (its attributes and the other mixins' methods are the provider's)."""

    config: dict[str, Any]
    name: str
    _pinger: Any

    def prepare(self) -> None:
        cfg = self.config
        if parse_bool(os.environ.get("SANDBOX_GPU_ENABLED", ""), "SANDBOX_GPU_ENABLED"):
            cfg["gpu"] = "all"
        if parse_bool(os.environ.get("SANDBOX_GPU_NETWORK_ENABLED", ""), "SANDBOX_GPU_NETWORK_ENABLED"):
            cfg["gpu_network"] = True
        try:
            self.docker = docker_client(cfg.get("docker_host") or "")
            info = self.docker.info()
            # a short-timeout client for the engine check before a one-shot waits on a failing pool
            # (docker.py _engine_answers), made now with the API version known: no request to make it
            self._pinger = docker_client(cfg.get("docker_host") or "", timeout=PING_TIMEOUT,
                                         version=self.docker.api.api_version)
        except Exception as e:  # noqa: BLE001
            raise ProviderUnavailableError(engine_error(e), details={"provider": self.name}) from None
        runtimes = info.get("Runtimes") or {}
        self.engine_id = docker_uid.engine_key(info)
        self.live_restore = bool(info.get("LiveRestoreEnabled"))  # boxes outlive its restarts (docker_sessions.py)
        wanted = cfg.get("runtime") or ""
        self._notes = []
        if wanted and wanted not in runtimes:
            raise InvalidConfigError(f"runtime {wanted!r} is not registered with the Docker engine "
                                     f"(known: {', '.join(sorted(runtimes))})",
                                     details={"field": "runtime", "value": wanted})
        if not wanted:
            wanted = "runsc" if "runsc" in runtimes else "runc"
            if wanted == "runc":
                self._notes.append("runsc (gVisor) is not registered with dockerd; containers run under "
                                   "runc (isolation tier 'container')")
        self.runtime = wanted
        # Instance attribute shadows the class tier: the real tier of this configuration.
        self.isolation = Isolation.GVISOR if wanted == "runsc" else Isolation.CONTAINER
        self.egress_cap = self._egress_policy()
        self._preload, note = effective_preload(cfg.get("preload") or "auto", wanted, parse_size(cfg["max_memory"]))
        if note:
            self._notes.append(note)
            log.warning("docker: %s", note)
        if self.egress_cap.mode != "none" and wanted == "runsc":
            if NET_RUNTIME not in runtimes:
                raise ProviderUnavailableError(
                    f"network {self.egress_cap.mode!r} under runsc needs the {NET_RUNTIME!r} Docker runtime "
                    "(scripts/setup/test/45-runsc-net.sh registers it)", details={"provider": self.name})
        self._check_box_seccomp(info)
        uid_check = self.diagnose()["box_uids"]
        if not uid_check["ok"]:
            self._notes.append(f"docker: {uid_check['detail']}")
        host = cfg.get("docker_host") or os.environ.get("DOCKER_HOST", "")
        local_engine = not host or host.startswith("unix:")
        if local_engine:  # its boxes' open files count in this host's kernel (boxes/host_tables.py)
            host_tables.raise_once()
        self._gpu = docker_gpu_plan(cfg, wanted, info, local_engine=local_engine,
                                    dev_root=os.environ.get("EXECBOX_GPU_DEV_ROOT", "/dev"))
        if self._gpu.error is not None:  # no warm pool: its GPU containers could not start anyway
            self._notes.append(f"{self._gpu.error}; sessions fail with SB002 until this is fixed")
            cfg["pool_size"] = 0
        try:
            self.docker.images.get(cfg["image"])
        except Exception:  # noqa: BLE001
            raise ProviderUnavailableError(
                f"image {cfg['image']!r} not found in the Docker engine; build it with "
                "`execbox image build python`", details={"provider": self.name, "image": cfg["image"]},
            ) from None
        self._masked = None  # gVisor: the daemon's list; its /proc and /sys are the sentry's own
        if not is_gvisor(wanted):
            probe_labels = {OWNER_LABEL: self.owner, PROVIDER_LABEL: self.uid}
            self._masked = docker_masks.masked_paths(docker_masks.engine_defaults(self.docker, cfg["image"],
                                                                                  probe_labels))
        self._reaper = ThreadPoolExecutor(max_workers=2, thread_name_prefix="execbox-docker-reaper")
        self._removals = Removals(self._remove_later)
        self._warmer = ThreadPoolExecutor(max_workers=2, thread_name_prefix="execbox-docker-warmer")
        self.remove_stale()
        if self.network_enabled and os.geteuid() == 0:  # names and kernel-route chains of a crashed execbox
            stale = netns.reap_stale_once()
            if stale:
                log.warning("docker: removed %d network leftovers of dead execbox processes", len(stale))

    def _check_box_seccomp(self, info: dict[str, Any]) -> None:
        runtimes = [self.runtime]
        if self.runtime == "runsc" and self.network_enabled:
            runtimes.append(NET_RUNTIME)  # the runtime egress boxes actually run under
        check_box_seccomp(info, runtimes, self.name)
