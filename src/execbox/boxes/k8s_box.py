"""A box that is a Kubernetes pod: create it, wait for it, reach its agent over TCP, delete it.

The channel is a direct TCP connection from the gateway to the pod's relay port (see
agent/tcp_relay.py and docs/kubernetes.md for why not exec/attach); the API server is only on
the lifecycle path (create, poll, patch, delete; boxes/k8s_api.py). Every API failure becomes an
SB error there: 403/401 (RBAC) and timeouts are SB009; a pod that cannot start is SB004 here with
the pod's own reason (and its Warning events, e.g. FailedMount, when they can be read), and a pod
that failed to start is deleted before the error is raised.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from ..agent import protocol
from ..agent.tcp_relay import auth_mac
from ..errors import InstanceCreationError, ProviderUnavailableError, SandboxError
from . import k8s_spec as ks
from .agent_client import AgentClient, wait_readable
from .box import Box
from .k8s_api import PodApi, api_error

__all__ = ["PodApi", "PodBox", "api_error", "connect_agent", "marked_ended", "pod_addresses", "pod_ending",
           "pod_failure", "pod_ready", "start_pod"]

log = logging.getLogger("execbox.kubernetes")

FATAL_WAITING = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError", "RunContainerError", "ErrImageNeverPull"}
POLL = 0.2
CHALLENGE_MAX_FRAME = 4096
"""The largest pre-auth frame read from a pod's relay: its challenge is ~70 bytes of JSON (a nonce
of 32 hex digits). Whatever answers at the pod's address is not authenticated yet."""


class TcpTransport:
    """Transport over a TCP connection to a pod's relay (after the HMAC handshake)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, max_bytes: int, timeout: float) -> bytes:
        if not wait_readable(self.sock.fileno(), timeout):
            raise TimeoutError
        return self.sock.recv(max_bytes)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def connect_agent(host: str, port: int, token: str, name: str, timeout: float = 10.0) -> AgentClient:
    """Open the channel: connect, answer the relay's challenge, wait for the agent's ready frame."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise InstanceCreationError(f"{name}: cannot reach the agent at {host}:{port}: {e}",
                                    details={"pod": name}) from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setblocking(True)
    transport = TcpTransport(sock)
    client = AgentClient(transport, name)
    try:
        deadline = time.monotonic() + timeout
        frames = protocol.FrameBuffer(CHALLENGE_MAX_FRAME)  # before auth: whoever answers at that address
        challenge: list[dict[str, Any]] = []
        while not challenge:
            data = transport.recv(4096, deadline - time.monotonic())
            if not data:
                raise OSError("connection closed before the challenge")
            challenge = frames.feed(data)
        if not isinstance(challenge[0], dict) or challenge[0].get("event") != "challenge":
            raise protocol.ProtocolError(f"expected the relay's challenge, got {str(challenge[0])[:80]!r}")
        nonce = str(challenge[0].get("nonce", ""))
        transport.send(protocol.encode_frame({"op": "auth", "mac": auth_mac(token.encode(), nonce)}))
        client.wait_ready(max(1.0, deadline - time.monotonic()))
    except (TimeoutError, OSError, InstanceCreationError, ValueError, protocol.ProtocolError) as e:
        transport.close()
        msg = e.message if isinstance(e, SandboxError) else f"{type(e).__name__}: {e}"
        raise InstanceCreationError(f"{name}: agent handshake failed: {msg}", details={"pod": name}) from None
    return client


def marked_ended(pod: Any) -> bool:
    """A destroyed instance's pod, labelled ``ended`` (by any replica: at ``destroy_instance``, and
    again when its delete failed) so that every sweeper deletes it, no egress proxy grants it and
    no replica adopts it (providers/kubernetes_sweep.py, kubernetes_handover.py)."""
    return (pod.metadata.labels or {}).get(ks.L_STATE) == ks.ENDED


def pod_ending(pod: Any) -> str | None:
    """Why a pod that may still run and be Ready must not be taken (over) any more: it is being
    deleted (``deletionTimestamp``) or was marked ``ended`` (its instance destroyed by some replica).
    None while it may be."""
    if getattr(pod.metadata, "deletion_timestamp", None) is not None:
        return "its pod is being deleted"
    return "its pod was ended" if marked_ended(pod) else None


def pod_failure(pod: Any) -> str | None:
    """Why a pod cannot (or can no longer) run its agent, from its status; None while it may."""
    st = pod.status
    if st is None:
        return None
    if st.phase in ("Failed", "Succeeded"):
        return terminated_reason(pod) or f"pod {st.phase.lower()}"
    for cs in st.container_statuses or []:
        waiting = cs.state.waiting if cs.state else None
        if waiting is not None and waiting.reason in FATAL_WAITING:
            return f"{waiting.reason}: {waiting.message or ''}".strip(": ")
        term = cs.state.terminated if cs.state else None
        if term is not None:
            return terminated_reason(pod)
    return None


def terminated_reason(pod: Any) -> str | None:
    st = pod.status
    parts = []
    if st.reason:
        parts.append(f"{st.reason}: {st.message or ''}".strip(": "))
    for cs in st.container_statuses or []:
        term = cs.state.terminated if cs.state else None
        if term is not None:
            parts.append(f"container {term.reason or 'exited'} (exit code {term.exit_code})")
    return "; ".join(parts) or None


def pod_addresses(pod: Any) -> tuple[str, ...]:
    """The pod's IPs (``status.podIPs``, or ``podIP`` alone); none before it has one."""
    st = pod.status
    if st is None:
        return ()
    ips = tuple(str(p.ip) for p in st.pod_ips or [] if getattr(p, "ip", None))
    return ips or ((str(st.pod_ip),) if st.pod_ip else ())


def pod_ready(pod: Any) -> bool:
    st = pod.status
    if st is None or st.phase != "Running" or not st.pod_ip:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in st.conditions or [])


def pending_note(pod: Any) -> str:
    st = pod.status
    if st is None:
        return "no status yet"
    notes = [f"phase {st.phase}"]
    for c in st.conditions or []:
        if c.status != "True" and c.reason:
            notes.append(f"{c.type}={c.reason}: {c.message or ''}".strip(": "))
    for cs in st.container_statuses or []:
        if cs.state and cs.state.waiting and cs.state.waiting.reason:
            notes.append(f"waiting {cs.state.waiting.reason}")
    return ", ".join(notes)


class PodBox(Box):
    """A running box pod. ``destroy`` deletes the pod (in the background when a remover is set)."""

    def __init__(self, name: str, client: AgentClient, api: PodApi, pod_ip: str,
                 addresses: tuple[str, ...] | None = None) -> None:
        super().__init__(name, client, None, {})
        self.api = api
        self.pod_ip = pod_ip
        self.addresses = addresses or (pod_ip,)  # every IP of the pod (dual-stack: both families)
        self.remover: Callable[[Callable[[], None]], None] | None = None
        self.claimed: dict[str, str] = {}
        self.pod_status: str | None = None  # why the pod ended, once known
        self.on_delete_failed: Callable[[str, SandboxError], None] | None = None  # the provider retries it
        self.created_at = time.time()

    def alive(self) -> bool:
        """Not destroyed, and the channel not closed by the pod's end (a cheap non-blocking peek)."""
        if not super().alive():
            return False
        transport = self.client.transport
        if isinstance(transport, TcpTransport) and self.client.current is None:
            try:
                ready = wait_readable(transport.sock.fileno(), 0)
                if ready and not transport.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                    self.client.dead = "the pod closed its agent connection"
            except BlockingIOError:
                pass
            except OSError as e:
                self.client.dead = f"agent connection lost: {e}"
        return not self.client.dead

    def status_reason(self) -> str | None:
        """The pod's end reason (OOMKilled, Evicted, DeadlineExceeded, deleted) from the API.

        A reason the sweeper already recorded wins over "pod deleted" (it deletes ended pods)."""
        if self.pod_status and self.pod_status != "pod deleted":
            return self.pod_status
        try:
            pod = self.api.get_pod(self.name)
        except SandboxError:
            return self.pod_status
        reason = "pod deleted" if pod is None else pod_failure(pod)
        if reason and not (self.pod_status and reason == "pod deleted"):
            self.pod_status = reason
        return self.pod_status

    def oom_events(self) -> int:
        if not self.client.dead:
            return 0
        reason = self.status_reason() or ""
        return 1 if "OOMKilled" in reason else 0

    def remove(self) -> None:
        try:
            self.api.delete_pod(self.name)
        except SandboxError as e:
            if self.on_delete_failed is not None:
                self.on_delete_failed(self.name, e)
            else:
                log.warning("deleting pod %s failed; it is left until its expiry: %s", self.name, e.message)

    def destroy(self) -> None:
        with self._destroy_lock:
            if self.destroyed:
                return
            self.destroyed = True
        self.client.close()
        if self.remover is not None:
            self.remover(self.remove)
        else:
            self.remove()

    def info(self) -> dict[str, Any]:
        return {**super().info(), "pod": self.name, "namespace": self.api.ns, "pod_ip": self.pod_ip,
                **({"claimed_by": self.claimed} if self.claimed else {})}


def wait_pod_ready(api: PodApi, name: str, timeout: float) -> Any:
    """Poll until the pod is Ready; SB004 with the pod's reason on a fatal state or at ``timeout``."""
    deadline = time.monotonic() + timeout
    last = "not created yet"
    while True:
        pod = api.get_pod(name)
        if pod is None:
            raise InstanceCreationError(f"pod {name} was deleted before it became ready", details={"pod": name})
        failure = pod_failure(pod)
        if failure:
            raise InstanceCreationError(f"pod {name} cannot start: {failure}", details={"pod": name})
        if pod_ready(pod):
            return pod
        last = pending_note(pod)
        if time.monotonic() > deadline:
            events = api.warning_events(name)  # FailedMount, FailedScheduling: not in the pod's status
            last += "".join(f", {e}" for e in events[-3:])
            raise InstanceCreationError(f"pod {name} did not become ready within {timeout:.0f}s ({last})",
                                        details={"pod": name})
        time.sleep(POLL)


def start_pod(api: PodApi, manifest: dict[str, Any], token: str, port: int, ready_timeout: float,
              connect: Callable[[Any], tuple[str, int]] | None = None) -> PodBox:
    """Create the pod, wait for it, open its channel; delete it on any failure (nothing leaks)."""
    name = manifest["metadata"]["name"]
    created = time.time()  # activeDeadlineSeconds counts from about here, not from Ready
    try:
        api.create_pod(manifest)
    except ProviderUnavailableError as e:
        if "status" not in e.details:  # a timeout: the pod may exist all the same; best effort
            try:
                api.delete_pod(name)
            except SandboxError:
                pass  # the sweeper (warm_ttl, stuck rule) and shutdown remove it later
        raise
    try:
        pod = wait_pod_ready(api, name, ready_timeout)
        host, p = connect(pod) if connect else (pod.status.pod_ip, port)
        client = connect_agent(host, p, token, name)
        box = PodBox(name, client, api, pod.status.pod_ip, pod_addresses(pod))
        box.created_at = created
        return box
    except BaseException:
        try:
            api.delete_pod(name)
        except SandboxError as e:
            log.warning("could not delete failed pod %s (the sweeper retries): %s", name, e.message)
        raise
