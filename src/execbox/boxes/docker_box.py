"""A hardened container whose main process is the agent, reached over its attached stdin/stdout.

The container is created with every limit up front (network none, memory/CPU/pids, read-only
root, tmpfs /tmp, a size-limited /workspace and a host uid of its own (docker_host.py), no
capabilities, no-new-privileges, no log driver; under runc also a capped devpts of its own and the
host's block devices masked: docker_host.py, docker_masks.py), and the attach stream
(docker_attach.py) is opened *before* start so the agent's ready frame cannot be missed. Never ``docker exec``: one
long-lived stream per box. Owner labels live in docker_owner.py, OOM detection in docker_oom.py.

The end of that stream does not prove the box dead: dockerd closes every attach stream when it
stops, and an engine with ``--live-restore`` leaves the containers running. So a box handed
out (``recoverable``) whose stream ended asks the engine first (docker_recover.py): a container
that still runs is re-attached in place, its agent and contexts kept (review 52).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..agent import protocol
from ..errors import SEE_LOG, BoxStartFailed, InstanceCreationError
from .agent_client import AgentClient
from .box import READY_TIMEOUT, Box
from .docker_attach import AttachTransport, open_attach
from .docker_host import HostSide
from .docker_oom import at_memory_limit, engine_oom, exit_state, oom_file
from .docker_recover import GONE, StreamRecovery
from .docker_removals import Removals
from .docker_spec import ContainerSpec  # re-exported too (providers, tests)
from .oom_counter import OomCounter

log = logging.getLogger("execbox.docker")

class DockerBox(StreamRecovery, Box):
    """A running box container. Removal can be handed to a background reaper (``remover``)."""

    def __init__(self, name: str, client: AgentClient, docker_client: Any, container_id: str,
                 spec: ContainerSpec, transport: AttachTransport, host: HostSide) -> None:
        super().__init__(name, client, host.caller_dir, spec.agent_limits)
        self.docker = docker_client
        self.container_id = container_id
        self.spec = spec
        self.transport = transport
        self.host = host
        self.remover: Callable[[Callable[[], None]], None] | None = None
        self.keep_workspace = host.caller_dir is not None
        self._oom_file = oom_file(container_id)
        self._oom = OomCounter(self._oom_file) if self._oom_file else None
        self._oom_seen = 0
        self._created = time.time()
        self.claimed_by: dict[str, str] = {}
        self.warm_context: str | None = None  # an unused pre-forked Python child (see provider)
        self.net: Any = None  # boxes/jail_net.JailNet when the box has egress
        self.removals: Removals | None = None  # retries a failed removal (docker_removals.py)
        self._remove_lock = threading.Lock()
        self._removed = False
        self._recover_lock = threading.Lock()
        transport.probe = self._running

    def alive(self) -> bool:
        """Not destroyed, and its agent's stream still open. A pooled box is never read while it
        waits, so a container killed (or lost with a dockerd restart) meanwhile showed only here:
        ``ended()`` looks without waiting and without taking bytes from the agent client. A box
        handed out whose stream ended is alive while its container runs (``recover``), or while
        an engine with live-restore does not answer (it may still run: kept until it can tell)."""
        if self.destroyed:
            return False
        if not self.transport.ended():
            return not self.client.dead
        if self.recoverable:
            return self.recover() != GONE
        self.client.dead = self.client.dead or "stream closed"
        return False

    def _running(self) -> bool:
        """Does the engine say the container runs? (Asked by a stalled send; True when it cannot tell.)"""
        try:
            state = self.docker.api.inspect_container(self.container_id).get("State") or {}
        except Exception as e:  # noqa: BLE001
            return "no such container" not in str(e).lower()
        return bool(state.get("Running"))

    def oom_events(self) -> int:
        """OOM kills in the container's memory cgroup; from container state once it has exited."""
        count = self._oom.read() if self._oom else None
        if self.client.dead and not count and self._oom_file and at_memory_limit(self._oom_file):
            # gVisor's sentry can kill the sandbox at its memory limit without a host OOM kill: a box
            # that died with its peak at the limit ran out of memory.
            count = 1
        if count is None or self.client.dead:
            # The agent's stream can close before the engine records the OOM kill (seen under runsc).
            settle = bool(self.client.dead and not count)
            count = max(count or 0, int(engine_oom(self.docker.api, self.container_id, self._created, settle)))
        self._oom_seen = max(self._oom_seen, count)
        return self._oom_seen

    def kill(self) -> None:
        try:
            self.docker.api.kill(self.container_id)
        except Exception:  # noqa: BLE001 - already stopped or gone
            pass

    def remove(self) -> None:
        """Remove the container, then its host side (workspace mounts, uid lease); idempotent.
        A container that could not be removed keeps its uid and workspace (``removals`` retries)."""
        try:
            self.try_remove()
        except Exception:  # noqa: BLE001 - logged by try_remove
            pass

    def try_remove(self) -> None:
        """``remove``, raising the engine's error when the container could not be removed."""
        with self._remove_lock:
            if self._removed:
                return
            if self._oom is not None:
                self._oom.close()
            net, self.net = self.net, None
            if net is not None:
                net.detach()
            failed = try_remove_container(self.docker.api, self.container_id, self.name)
            if failed is not None:
                raise failed
            self._removed = True
            self.host.release()

    def destroy(self) -> None:
        """Close the stream and remove the container: in the background, retried until it succeeds,
        when ``removals`` is set (else by ``remover``, else at once)."""
        with self._destroy_lock:
            if self.destroyed:
                return
            self.destroyed = True
        self.client.close()
        if self.removals is not None:
            self.removals.add(self.container_id, self.try_remove, self.host.caller_dir, self.name)
        elif self.remover is not None:
            self.remover(self.remove)
        else:
            self.remove()

    def info(self) -> dict[str, Any]:
        return {**super().info(), "container": self.container_id[:12], "container_name": self.name,
                "runtime": self.spec.runtime, "image": self.spec.image, "box_uid": self.host.uid,
                **({"claimed_by": self.claimed_by} if self.claimed_by else {})}


VOLUME_PATIENCE = 15.0
"""Seconds to keep retrying a volume the engine still reports in use after its container's removal
returned. A CI run on a busy 2-core machine leaked a workspace volume with no container left;
one second of retries at teardown, and a single try on a failed start or at shutdown, were the
paths that could leave one."""


def remove_volume(api: Any, name: str, patience: float = VOLUME_PATIENCE) -> bool:
    """Remove a workspace volume, retrying while the engine still counts it in use; False if kept."""
    deadline = time.monotonic() + patience
    delay = 0.1
    while True:
        try:
            api.remove_volume(name, force=True)
            return True
        except Exception as e:  # noqa: BLE001 - in use for a moment after container removal
            if "no such volume" in str(e).lower():
                return True
            if time.monotonic() + delay > deadline:
                log.warning("removing volume %s failed after %.0fs: %s", name, patience, e)
                return False
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def remove_container(api: Any, container_id: str, name: str) -> bool:
    """Force-remove a container; True once it is gone (also when it already was)."""
    return try_remove_container(api, container_id, name) is None


def try_remove_container(api: Any, container_id: str, name: str) -> Exception | None:
    """Force-remove a container; None once it is gone (also when it already was), else the
    engine's error (logged)."""
    try:
        api.remove_container(container_id, force=True, v=True)
    except Exception as e:  # noqa: BLE001
        if "No such container" not in str(e):
            log.warning("removing container %s failed: %s", name, e)
            return e
    return None


def start_container(docker_client: Any, spec: ContainerSpec, host: HostSide,
                    ready_timeout: float = READY_TIMEOUT, removals: Removals | None = None) -> DockerBox:
    """Create, attach, start and wait for the agent's ready frame; clean up on any failure,
    ``host`` (released once the container is gone) included. A container the engine would not
    remove then is left to ``removals`` (retried; its host side released after)."""
    api = docker_client.api
    if spec.egress is not None and spec.egress.mode != "none" and spec.egress_ca is None:
        from .jail_net import new_ca

        spec.egress_ca = new_ca(spec.name, spec.egress)
    container_id: str | None = None
    transport: AttachTransport | None = None
    box: DockerBox | None = None
    try:
        container_id = api.create_container(**spec.create_args(api.api_version))["Id"]
        transport = open_attach(api, container_id)
        api.start(container_id)
        client = AgentClient(transport, spec.name)
        box = DockerBox(spec.name, client, docker_client, container_id, spec, transport, host)
        if spec.egress is not None and spec.egress.mode != "none":
            from .docker_net import attach as attach_net

            box.net = attach_net(api, container_id, spec.name, spec.egress, spec.egress_ca)
        try:
            client.wait_ready(ready_timeout)
        except InstanceCreationError as e:
            tail = transport.stderr_tail.decode("utf-8", "replace")[-2000:]
            reason = f"{e.message}; {exit_state(api, container_id)}; agent stderr: {tail or '(empty)'}"
            log.warning("docker: %s", reason)  # the engine's words and host paths: the log only
            raise BoxStartFailed(f"{e.message} ({SEE_LOG})", reason,
                                 details={"container": spec.name, "runtime": spec.runtime}) from None
        return box
    except BaseException:
        if box is not None and box.net is not None:
            box.net.detach()  # closes the CA too
        elif spec.egress_ca is not None:
            spec.egress_ca.close()
        if transport is not None:
            transport.close()
        if container_id is None:
            host.release()
        elif removals is not None:
            removals.add(container_id, _remover(api, container_id, spec.name, host), host.caller_dir, spec.name,
                         background=False)
        elif remove_container(api, container_id, spec.name):
            host.release()
        raise


def _remover(api: Any, container_id: str, name: str, host: HostSide) -> Callable[[], None]:
    def attempt() -> None:
        failed = try_remove_container(api, container_id, name)
        if failed is not None:
            raise failed
        host.release()
    return attempt


def reattach_container(docker_client: Any, container_id: str, workspace: str | None,
                       ping_timeout: float = 10.0) -> DockerBox:
    """A DockerBox for a container a previous execbox process started and left running.

    The agent is the container's main process and the container keeps its stdin open
    (``stdin_open``, not ``stdin_once``), so a new ``attach`` stream reaches the same agent with
    its contexts. Output written while nobody was attached is lost (the log driver is "none");
    request ids start far from the previous process's so a late reply to one of its requests
    can never be mistaken for ours. A ping proves the agent answers; a run the previous process
left (its requester is gone with it) is cancelled, or our first request would wait it out (a
Python cell is interrupted, its context kept). The uid lease and host dir
    recorded on the container's labels are taken over (SB004 when that is refused)."""
    import itertools
    import secrets

    api = docker_client.api
    attrs = api.inspect_container(container_id)
    if not attrs["State"].get("Running"):
        raise InstanceCreationError(f"container {container_id[:12]} is not running",
                                    details={"container": container_id[:12]})
    cfg, host = attrs["Config"], attrs["HostConfig"]
    labels = dict(cfg.get("Labels") or {})
    side = HostSide.reopen(labels, workspace)
    spec = ContainerSpec(image=cfg.get("Image", ""), runtime=host.get("Runtime") or "", name=attrs["Name"].lstrip("/"),
                         labels=labels, memory_bytes=int(host.get("Memory") or 0),
                         cpus=(host.get("NanoCpus") or 0) / 1e9, pids_limit=int(host.get("PidsLimit") or 0),
                         host_workspace=workspace, run_as=side.uid)
    try:
        transport = open_attach(api, attrs["Id"])
    except BaseException:
        side.detach()
        raise
    client = AgentClient(transport, spec.name)
    client.ids = itertools.count(1_000_000_000 + secrets.randbelow(1_000_000_000))
    try:
        pong = client.call("ping", timeout=ping_timeout)  # answered beside a run
        client.cancel_any()  # a run of the previous process's would hold the box until it ends
    except BaseException:
        transport.close()
        side.detach()
        raise
    client.hello = {"event": "ready", "pid": pong.get("pid"), "reattached": True}
    client.beside_run = protocol.FILE_OPS.intersection(pong.get("beside_run") or ())  # an older agent: none
    box = DockerBox(spec.name, client, docker_client, attrs["Id"], spec, transport, side)
    box.keep_workspace = workspace is not None
    return box
