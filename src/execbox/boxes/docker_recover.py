"""What a Docker box does when its attach stream ends (review 52): ask the engine before taking the
box for dead, and re-attach in place to a container that still runs.

dockerd closes every attach stream when it stops; with ``--live-restore`` the containers run on, so
the end of the stream alone proves nothing. ``recover`` asks the engine (``inspect``): a container
that still runs gets a new attach stream under the same agent client (a ``ping`` must answer, and a
run cut off with the old stream is cancelled: its requester was answered already), keeping the
agent's contexts; a stopped or removed one is a dead box; while the engine does not answer, one
that keeps containers across its restarts (live-restore) keeps the box until it can tell, and one
that does not stopped its containers when it stopped. Mixed into DockerBox (docker_box.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..agent import protocol
from .docker_attach import open_attach
from .docker_removals import engine_unreachable

if TYPE_CHECKING:
    from .agent_client import AgentClient
    from .docker_attach import AttachTransport

log = logging.getLogger("execbox.docker")

RUNNING, GONE, UNKNOWN = "running", "gone", "unknown"
"""What ``DockerBox.recover`` (and ``engine_state``) found: the container runs (re-attached), it is
gone or stopped, or the engine cannot tell now (it does not answer)."""
REATTACH_PING = 5.0
"""Seconds a re-attached agent has to answer its ping."""
QUIET_WAIT = 3.0
"""Seconds ``recover`` waits for requests still on the ended stream to give up (they fail at its EOF)."""


class StreamRecovery:
    """``recover`` and its parts, for DockerBox."""

    name: str
    client: AgentClient
    transport: AttachTransport
    docker: Any
    container_id: str
    destroyed: bool

    recoverable = False
    """Handed out (the provider sets it): asked about, and re-attached, when its stream ends. A
    pool box is not: it is checked under the pool's lock, and has nothing to keep."""
    engine_keeps_boxes = False
    """The engine runs with live-restore: its stop or restart leaves the containers running."""
    probe_client: Any = None
    """A short-timeout client for ``engine_state`` (None: the box's own)."""
    _recover_lock: threading.Lock
    _running: Callable[[], bool]  # the stalled-send probe (docker_box.py)

    def recover(self, ping_timeout: float = REATTACH_PING) -> str:
        """After the attach stream ended: ask the engine whether the container still runs, and if
        so attach a new stream to the same agent (its run in flight, if any, is cancelled: its
        requester was answered already). RUNNING (re-attached, or the stream was fine), GONE (the
        container stopped or is gone, or cannot be re-attached: the box is dead), or UNKNOWN (the
        engine does not answer and keeps containers across its restarts: ask again later)."""
        with self._recover_lock:
            if self.destroyed:
                return GONE
            if not self.transport.ended():
                return GONE if self.client.dead else RUNNING
            state = self.engine_state()
            if state == UNKNOWN and self.engine_keeps_boxes:
                return UNKNOWN
            if state != RUNNING:  # without live-restore a stopped engine stopped its containers too
                self.client.dead = self.client.dead or "stream closed"
                return GONE
            if not self._quiet():  # a request still on the old stream: not yet
                return UNKNOWN
            try:
                if not self._reattach(ping_timeout):
                    return UNKNOWN  # a request still on the old stream: not yet
            except Exception as e:  # noqa: BLE001 - the engine went again, or the agent does not answer
                if engine_unreachable(e) and self.engine_keeps_boxes:
                    return UNKNOWN
                log.warning("docker: re-attaching %s after its stream ended failed: %s", self.name, e)
                self.client.dead = self.client.dead or f"re-attach failed: {e}"
                return GONE
            log.info("docker: %s re-attached: its attach stream ended (engine restart) but it still runs", self.name)
            return RUNNING

    def engine_state(self) -> str:
        """RUNNING, GONE (stopped, or no such container) or UNKNOWN (the engine does not answer)."""
        try:
            state = (self.probe_client or self.docker).api.inspect_container(self.container_id).get("State") or {}
        except Exception as e:  # noqa: BLE001
            return GONE if "no such container" in str(e).lower() else UNKNOWN
        return RUNNING if state.get("Running") else GONE

    def _quiet(self) -> bool:
        """No request of the agent client still on the stream (each fails at its EOF, at once)."""
        deadline = time.monotonic() + QUIET_WAIT
        client = self.client
        while True:
            with client.mail_cond:
                if not client.mail and not client.reading:
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)

    def _reattach(self, ping_timeout: float) -> bool:
        """A new attach stream under the same agent client; the agent must answer a ping. False
        (nothing changed) when a request took to the old stream meanwhile."""
        transport = open_attach(self.docker.api, self.container_id, probe=self._running)
        client, old = self.client, self.transport
        with client.write_lock, client.mail_cond:  # no send nor read on the old stream past this
            if client.mail or client.reading:
                transport.close()
                return False
            client.transport = transport
            client.frames = protocol.FrameBuffer(client.max_frame)
            client.inbox = []
            client.dead = None
        self.transport = transport
        old.close()
        try:
            client.call("ping", timeout=ping_timeout)  # answered beside a run
            client.cancel_any()  # a run cut off with the old stream would hold the agent
        except BaseException:
            client.dead = client.dead or "no answer after re-attaching"
            raise
        return True
