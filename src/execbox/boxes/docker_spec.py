"""What a box container is created with (``ContainerSpec``): every limit up front, the mounts,
the hardening, for the engine's high-level and low-level APIs (docker_box.py starts it)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from . import oci_seccomp
from .box import AGENT_BOOT, agent_source_dir
from .images import AGENT_ROOT, PYTHON, SANDBOX_UID, WORKSPACE
from .runtime import PIP_MOUNT, RUNTIME_MOUNT, SESSION_SITE
from .staging import staged_pip


@dataclass
class ContainerSpec:
    """Everything a box container is created with; ``create_kwargs()`` is what Docker receives."""

    image: str
    runtime: str
    name: str
    labels: dict[str, str]
    memory_bytes: int
    cpus: float
    pids_limit: int
    tmpfs_size: str = "64m"
    network: bool = False
    gpu: bool = False
    gpu_ids: list[str] | None = None  # None with gpu: every GPU; else these indices
    host_workspace: str | None = None  # bound on /workspace; None: a tmpfs of workspace_tmpfs bytes
    workspace_tmpfs: int = 0
    run_as: int = SANDBOX_UID  # user code's uid and gid (docker_uid.py)
    nss: dict[str, str] = field(default_factory=dict)  # /etc/passwd, /etc/group naming run_as
    preload: str = "auto"
    agent_limits: dict[str, Any] = field(default_factory=dict)
    egress: Any = None  # EgressPolicy; not "none": network "none" + the gateway (boxes/docker_net.py)
    egress_ca: Any = None  # egress.inject.BoxCA when the policy injects credentials
    pts_host: str | None = None  # the box's capped devpts on the host (docker_host.py), bound on /dev/pts
    masked_paths: list[str] | None = None  # HostConfig MaskedPaths (docker_masks.py); None: the engine's

    def command(self) -> list[str]:
        return [PYTHON, "-I", "-c", AGENT_BOOT, AGENT_ROOT, "execbox_agent.main", "--workspace", WORKSPACE,
                "--preload", self.preload, "--limits", json.dumps(self.agent_limits, sort_keys=True),
                "--run-as", f"{self.run_as}:{self.run_as}", *(["--pid-ns"] if self.pid_ns else [])]

    @property
    def pid_ns(self) -> bool:
        """gVisor: user code in a PID namespace of its own (agent/pidns.py says why)."""
        return oci_seccomp.is_gvisor(self.runtime)

    def create_kwargs(self) -> dict[str, Any]:
        from docker.types import Mount

        mounts = [Mount(target=f"{AGENT_ROOT}/execbox_agent", source=agent_source_dir(), type="bind",
                        read_only=True)]
        tmpfs = {"/tmp": f"rw,nosuid,nodev,size={self.tmpfs_size},mode=1777"}
        if self.host_workspace:
            mounts.append(Mount(target=WORKSPACE, source=self.host_workspace, type="bind"))
        elif self.workspace_tmpfs:
            tmpfs[WORKSPACE] = (f"rw,nosuid,nodev,size={self.workspace_tmpfs},mode=0700,"
                                f"uid={self.run_as},gid={self.run_as}")
        mounts += [Mount(target=t, source=src, type="bind", read_only=True) for t, src in sorted(self.nss.items())]
        if self.pts_host and not self.pid_ns:  # never under gVisor: its sentry has a devpts of its own
            # Docker drops its default /dev/pts for this; runc's /dev/ptmx links to pts/ptmx
            mounts.append(Mount(target="/dev/pts", source=self.pts_host, type="bind"))
        kwargs: dict[str, Any] = {
            "image": self.image,
            "command": self.command(),
            "name": self.name,
            "labels": dict(self.labels),
            "runtime": self.runtime,
            # uid 0 with only the capabilities the agent's privilege separation needs: it forks
            # user code as run_as with none (agent/privsep.py), so code cannot signal,
            # trace or read the agent.
            "user": "0:0",
            "cap_add": list(PRIVSEP_CAPS) + (["SYS_ADMIN"] if self.pid_ns else []),
            "working_dir": WORKSPACE,
            "stdin_open": True,
            "tty": False,
            "detach": True,
            "init": True,
            "network_mode": "bridge" if self.network else "none",
            "mem_limit": self.memory_bytes,
            "memswap_limit": self.memory_bytes,
            "nano_cpus": int(self.cpus * 1e9),
            "pids_limit": self.pids_limit,
            "read_only": True,
            "tmpfs": tmpfs,
            "mounts": mounts,
            # The agent's stdout carries every reply (file contents, run output): json-file kept an
            # unbounded host copy of it. Nothing reads container logs; the attach stream is all.
            "log_config": {"type": "none", "config": {}},
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges", oci_seccomp.security_opt(self.runtime)],
            "ulimits": [],
        }
        # in-session installs land here (providers/install.py); the agent puts them on sys.path
        # (and a runtime template image's node_modules, which this overrides the image's NODE_PATH for)
        kwargs["environment"] = {"PYTHONPATH": SESSION_SITE,
                                 "NODE_PATH": f"{WORKSPACE}/node_modules:{RUNTIME_MOUNT}/node_modules"}
        if self.egress is not None and self.egress.mode != "none":
            from .docker_net import DNS_OPTS

            kwargs.update(network_mode="none", **DNS_OPTS)
            pip_root = staged_pip()
            if pip_root:
                kwargs["mounts"] = [*kwargs["mounts"], Mount(target=PIP_MOUNT, source=pip_root, type="bind",
                                                             read_only=True)]
            if self.egress_ca is not None:
                from .docker_net import ca_kwargs

                extra = ca_kwargs(self.egress_ca)
                kwargs["mounts"] = kwargs["mounts"] + extra["mounts"]
                kwargs["environment"] = {**kwargs.get("environment", {}), **extra["environment"]}
        if self.gpu:
            kwargs["device_requests"] = [gpu_device_request(self.gpu_ids)]
        return kwargs

    def create_args(self, api_version: str) -> dict[str, Any]:
        """``create_kwargs()`` as docker-py's ``containers.create`` turns them into the arguments
        of ``APIClient.create_container``, plus the HostConfig keys docker-py has no argument for
        (``MaskedPaths``, API 1.40)."""
        from docker.models.containers import _create_container_args

        args = _create_container_args({**self.create_kwargs(), "version": api_version})
        if self.masked_paths is not None:
            args["host_config"]["MaskedPaths"] = list(self.masked_paths)
        return args


PRIVSEP_CAPS = ("SETUID", "SETGID", "SETPCAP")
"""The only capabilities a box container keeps; the agent drops them all for user code."""


def gpu_device_request(ids: list[str] | None) -> Any:
    """Docker's ``--gpus`` as a device request: all GPUs, or the given indices (runc via the
    NVIDIA Container Toolkit; runsc via the same request when registered with ``--nvproxy``)."""
    from docker.types import DeviceRequest

    if ids:
        return DeviceRequest(device_ids=list(ids), capabilities=[["gpu"]])
    return DeviceRequest(count=-1, capabilities=[["gpu"]])
