"""A Docker box whose attach stream ended (review 52, F1): dockerd closes every attach stream when
it stops, and with ``--live-restore`` the containers keep running. The box asks the engine before
it is taken for dead (``DockerBox.recover``): still running, it is re-attached to the same agent;
stopped or gone, it is dead; while the engine does not answer, an engine with live-restore keeps it
(an engine without stops its containers with it). The engine and the agent are faked at their
boundaries: docker-py's ``inspect_container``/``attach_socket`` and Docker's multiplexed stream."""

from __future__ import annotations

import json
import socket
import struct
import threading

import pytest
import requests

from execbox.boxes.agent_client import AgentClient, BoxDied
from execbox.boxes.docker_attach import AttachTransport
from execbox.boxes.docker_box import DockerBox
from execbox.boxes.docker_host import HostSide
from execbox.boxes.docker_recover import GONE, RUNNING, UNKNOWN
from execbox.boxes.docker_spec import ContainerSpec
from execbox.errors import ProviderUnavailableError
from execbox.providers.agent_backed import Instance
from execbox.providers.docker import DockerProvider

DOWN = requests.exceptions.ConnectionError("('Connection aborted.', FileNotFoundError(2, 'No such file'))")


def _agent(sock: socket.socket, seen: list[dict]) -> None:
    """The engine's end of an attach stream: requests in as plain frames, replies out as stdout frames."""
    buf = b""
    with sock:
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
                size = struct.unpack(">I", buf[:4])[0]
                msg, buf = json.loads(buf[4:4 + size]), buf[4 + size:]
                seen.append(msg)
                if msg.get("op") == "ping":
                    body = json.dumps({"id": msg["id"], "ok": True, "value": {"pid": 7}}).encode()
                    frame = struct.pack(">I", len(body)) + body
                    sock.sendall(bytes([1, 0, 0, 0]) + struct.pack(">I", len(frame)) + frame)


class Api:
    """docker-py's low-level API as the box uses it: the container's state, new attach streams."""

    def __init__(self) -> None:
        self.state: dict | Exception = {"Running": True}
        self.attached: list[socket.socket] = []
        self.seen: list[dict] = []

    def inspect_container(self, _cid: str) -> dict:
        if isinstance(self.state, Exception):
            raise self.state
        return {"State": self.state}

    def attach_socket(self, _cid: str, params: dict) -> socket.socket:
        if isinstance(self.state, Exception):
            raise self.state
        ours, engine = socket.socketpair()
        self.attached.append(engine)
        threading.Thread(target=_agent, args=(engine, self.seen), daemon=True).start()
        return ours

    def kill(self, _cid: str) -> None:
        pass


def _box(api: Api, keeps: bool = False) -> tuple[DockerBox, socket.socket]:
    ours, engine = socket.socketpair()
    transport = AttachTransport(ours)
    spec = ContainerSpec(image="i", runtime="runc", name="box", labels={}, memory_bytes=0, cpus=1.0, pids_limit=0)
    box = DockerBox("box", AgentClient(transport, "box"), type("D", (), {"api": api})(), "c" * 64, spec,
                    transport, HostSide(None, None))
    box.recoverable, box.engine_keeps_boxes = True, keeps
    return box, engine


def test_a_stream_that_ended_under_a_running_container_is_re_attached_to_the_same_agent():
    api = Api()
    box, engine = _box(api)
    engine.close()  # dockerd stopped: every attach stream ends
    assert box.alive()  # the engine says the container runs: re-attached, not dead
    assert len(api.attached) == 1 and box.client.dead is None
    assert box.client.call("ping", timeout=5) == {"pid": 7}  # requests go over the new stream
    assert [m.get("op") for m in api.seen] == ["ping", "cancel", "ping"]  # a run cut off with the stream is stopped
    assert api.seen[1]["target"] == "*"
    assert box.alive() and len(api.attached) == 1


@pytest.mark.parametrize("state", [{"Running": False}, Exception("404 Client Error: No such container: c")])
def test_a_stream_that_ended_with_its_container_is_a_dead_box(state):
    api = Api()
    box, engine = _box(api, keeps=True)
    api.state = state
    engine.close()
    assert not box.alive() and box.recover() == GONE
    assert box.client.dead and not api.attached


def test_while_the_engine_does_not_answer_only_an_engine_with_live_restore_keeps_the_box():
    kept, engine = _box(Api(), keeps=True)
    kept.docker.api.state = DOWN
    engine.close()
    assert kept.recover() == UNKNOWN and kept.alive()  # it may still run: asked again later
    kept.docker.api.state = {"Running": True}  # the engine is back
    assert kept.recover() == RUNNING and kept.client.dead is None
    gone, engine = _box(Api(), keeps=False)  # without live-restore a stopped engine stopped its containers
    gone.docker.api.state = DOWN
    engine.close()
    assert gone.recover() == GONE and not gone.alive()


def test_a_pool_box_is_never_re_attached():
    """A box waiting in the pool is checked under the pool's lock: an ended stream discards it."""
    api = Api()
    box, engine = _box(api)
    box.recoverable = False
    engine.close()
    assert not box.alive() and not api.attached


def _provider(box: DockerBox) -> tuple[DockerProvider, Instance]:
    p = DockerProvider()
    p.initialized = True
    inst = Instance("t:s:1", box, "t", "s")
    p._instances[inst.instance_id] = inst
    return p, inst


def test_a_request_cut_off_by_an_engine_restart_keeps_its_box():
    """The provider's answer to a request whose stream ended: SB009 with the box kept (re-attached,
    or kept until the engine answers); a box whose container stopped is given up as before."""
    api = Api()
    box, engine = _box(api, keeps=True)
    p, inst = _provider(box)
    api.state = DOWN
    engine.close()
    with pytest.raises(ProviderUnavailableError) as ei:
        p.execute_code(inst.instance_id, "print(1)", "python")
    assert ei.value.details["reason"] == "docker_engine_unavailable" and ei.value.details["box_died"] is False
    assert not box.destroyed and p.instance_alive(inst.instance_id)
    api.state = {"Running": True}
    with pytest.raises(ProviderUnavailableError) as ei:  # the engine is back mid-request: re-attached
        p._box_died(inst, BoxDied("box stopped answering: its agent exited (stream closed)"))
    assert ei.value.details["reason"] == "docker_engine_restarted" and ei.value.retry_after == 1
    assert not box.destroyed and box.client.dead is None
    for s in api.attached:
        s.close()  # and now the container stops for good
    api.state = {"Running": False}
    with pytest.raises(ProviderUnavailableError) as ei:
        p.execute_code(inst.instance_id, "print(1)", "python")
    assert ei.value.details["box_died"] is True and box.destroyed
