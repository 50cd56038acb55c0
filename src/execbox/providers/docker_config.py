"""Provider ``docker``'s configuration and host facts: its admin schema, the engine client and the
(cached) probe that decides whether the backend is usable here. Split from providers/docker.py, which
keeps the pool and box lifecycle.
"""

from __future__ import annotations

import os
import time
from typing import Any
from urllib.parse import urlsplit

from ..boxes import docker_uid, oci_seccomp, quota
from ..boxes.images import DEFAULT_IMAGE
from ..egress.schema import NETWORK_SCHEMA
from ..errors import ProviderUnavailableError
from ..redaction import redact_url_credentials
from .agent_backed import POLICY_SCHEMA, TIMEOUT_SCHEMA
from .gpu_config import GPU_SCHEMA

MEMORY_OPTIONS = ["128m", "256m", "512m", "1g"]
AVAILABILITY_TTL = 30.0
RUNSC_PIDS_HEADROOM = 4096


def runsc_host_pids(pids: int) -> int:
    """Host cgroup pids for a runsc box. Under the ptrace platform every sandboxed task also costs
    host threads (a stub plus its tracer) on top of ~75 sentry/gofer threads; the user-facing
    limit is enforced inside gVisor instead (RLIMIT_NPROC), this one only stops a runaway sentry."""
    return RUNSC_PIDS_HEADROOM + 4 * pids


_availability_cache: dict[str, tuple[float, tuple[bool, str]]] = {}


def docker_client(base_url: str = "", timeout: float = 30.0, version: str | None = None) -> Any:
    """A docker-py client; ``version`` given: no request to the engine to learn its API version
    (so making one cannot fail while the engine is down)."""
    import docker

    kw: dict[str, Any] = {"timeout": int(timeout)}
    if version:
        kw["version"] = version
    if base_url:
        return docker.DockerClient(base_url=base_url, **kw)
    return docker.from_env(**kw)


def config_schema() -> dict[str, dict[str, Any]]:
    """The admin console's fields for provider ``docker`` (validated by providers/schema.py)."""
    return {
        "image": {"type": "string", "default": DEFAULT_IMAGE, "label": "Worker image",
                  "description": "Image with python3 and node (build it with `execbox image build`)."},
        "runtime": {"type": "string", "default": "", "options": ["", "runc", "runsc"], "label": "Runtime",
                    "description": "runsc (gVisor) or runc; empty = runsc when the engine has it, "
                                   "else runc with a warning."},
        "pool_size": {"type": "integer", "default": 5, "min": 0, "max": 100, "label": "Warm pool size",
                      "description": "Started, ready containers kept per image."},
        "pool_wait": {"type": "number", "default": 10, "min": 0, "max": 300, "label": "Pool wait (s)",
                      "description": "How long create_instance waits for a pooled container when "
                                     "the pool is drained before failing with SB004."},
        "max_memory": {"type": "string", "default": "512m", "options": MEMORY_OPTIONS,
                       "label": "Memory limit", "description": "Container memory limit (no swap)."},
        "cpus": {"type": "number", "default": 1.0, "min": 0.1, "max": 64, "label": "CPUs",
                 "description": "CPU quota per container."},
        "pids_limit": {"type": "integer", "default": 128, "min": 16, "max": 4096, "label": "Pids limit",
                       "description": "Most processes and threads a container may hold."},
        "disk_quota_mb": {"type": "integer", "default": 512, "min": 8, "max": 1048576,
                          "label": "Workspace quota (MB)",
                          "description": "Size of each box's /workspace (the jail's key): an ext4 image as root, "
                                         "else a tmpfs; writing past it fails (ENOSPC, 507)."},
        **TIMEOUT_SCHEMA,
        "max_output_bytes": {"type": "integer", "default": 1048576, "min": 1024, "max": 64 * 1048576,
                             "label": "Output cap (bytes)",
                             "description": "Cap on stdout and stderr each."},
        **NETWORK_SCHEMA,
        **GPU_SCHEMA,  # gpu (off | all | indices; SANDBOX_GPU_ENABLED=true = all), gpu_tenant_cap
        "gpu_network": {"type": "boolean", "default": False, "label": "GPU network",
                        "description": "Allow the configured network (open if none) in GPU containers (also "
                                       "SANDBOX_GPU_NETWORK_ENABLED=true)."},
        "preload": {"type": "string", "default": "auto", "label": "Preload modules",
                    "description": "'auto' (numpy, pandas, matplotlib if installed), 'none', or a "
                                   "comma-separated list ('auto,torch')."},
        "docker_host": {"type": "string", "default": "", "label": "Docker host",
                        "placeholder": "unix:///var/run/docker.sock",
                        "description": "Engine URL (unix://, tcp://, ssh://user@host or npipe://; no password, "
                                       "query or fragment); empty = DOCKER_HOST or the local socket."},
        **POLICY_SCHEMA,
    }


DOCKER_HOST_SCHEMES = ("unix", "tcp", "ssh", "npipe", "http", "https")
"""What docker-py connects to (http/https are its aliases of tcp)."""


def docker_host_problem(value: Any) -> str | None:
    """Why ``value`` is not a usable ``docker_host``, or None; like the other URL fields
    (schema.url_problem), the message never echoes the value: it is shown whole in the config,
    errors and logs, so a password in it would be a secret where none may be."""
    raw = str(value or "").strip()
    if not raw:
        return None
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return "docker_host must be a unix://, tcp://, ssh:// or npipe:// URL"
    if parts.scheme not in DOCKER_HOST_SCHEMES or "://" not in raw:
        return "docker_host must be a unix://, tcp://, ssh:// or npipe:// URL"
    if "@" in parts.netloc:
        userinfo = parts.netloc.rsplit("@", 1)[0]
        if ":" in userinfo or parts.scheme != "ssh":
            return "docker_host must not carry credentials (only ssh://user@host names a user; no password)"
    if parts.query or parts.fragment:
        return "docker_host must not carry a query or fragment"
    if parts.scheme in ("tcp", "ssh", "http", "https") and not parts.hostname:
        return f"docker_host must name a host ({parts.scheme}://HOST[:PORT])"
    return None


def engine_error(e: BaseException, doing: str = "not reachable") -> str:
    """``docker engine <doing>: <why>`` with the userinfo of any URL in docker-py's text hidden
    (it quotes DOCKER_HOST / docker_host whole when it refuses one)."""
    return f"docker engine {doing}: {redact_url_credentials(str(e))}"


def engine_availability() -> tuple[bool, str]:
    """dockerd answers, runsc is registered and the default image exists (cached per process)."""
    key = os.environ.get("DOCKER_HOST", "")
    hit = _availability_cache.get(key)
    if hit and time.monotonic() - hit[0] < AVAILABILITY_TTL:
        return hit[1]
    result = _probe()
    _availability_cache[key] = (time.monotonic(), result)
    return result


def _probe() -> tuple[bool, str]:
    try:
        client = docker_client(timeout=3)
    except Exception as e:  # noqa: BLE001
        return False, engine_error(e)
    try:
        info = client.info()
        if "runsc" not in (info.get("Runtimes") or {}):
            return False, ("runsc is not registered with dockerd (tier gvisor unavailable); "
                           "configure docker with runtime=runc for tier container")
        try:
            client.images.get(DEFAULT_IMAGE)
        except Exception:  # noqa: BLE001
            return False, f"image {DEFAULT_IMAGE} is missing: run `execbox image build python`"
        return True, f"docker {info.get('ServerVersion')} with runsc; image {DEFAULT_IMAGE}"
    except Exception as e:  # noqa: BLE001
        return False, engine_error(e, "not usable")
    finally:
        client.close()


def check_box_seccomp(info: dict[str, Any], runtimes: list[str], provider: str = "docker") -> None:
    """gVisor silently ignores the boxes' seccomp profile unless started with --oci-seccomp: SB009."""
    for rt in runtimes:
        if oci_seccomp.is_gvisor(rt) and not oci_seccomp.runsc_applies_seccomp(info, rt):
            raise ProviderUnavailableError(
                f"runtime {rt!r} is registered without --oci-seccomp, so gVisor would ignore the boxes' "
                "seccomp profile; add it to the runtime's runtimeArgs in /etc/docker/daemon.json and send "
                "dockerd SIGHUP (scripts/setup/test/40-docker.sh and 45-runsc-net.sh do both)",
                details={"provider": provider, "runtime": rt, "missing": "--oci-seccomp"})


def host_checks() -> dict[str, dict[str, Any]]:
    """What `execbox doctor` prints for docker: the boxes' host uids and how /workspace is bounded."""
    ok, detail = quota.loop_quota_possible()
    return {"box_uids": docker_uid.uid_check(),
            "workspace_quota": {"ok": ok, "detail": "an ext4 loop image of disk_quota_mb" if ok else
                                f"{detail}; /workspace is a tmpfs of disk_quota_mb (counts against max_memory)"}}
