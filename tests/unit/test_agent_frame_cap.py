"""The host reads a box's frames under a cap near the largest legitimate reply, not the agent's 512 MiB.

A box is untrusted and every frame is buffered in the service's memory (on kubernetes, the shared
gateway's), so a header announcing more than ``MAX_REPLY_FRAME`` is refused as soon as it is read:
nothing of its body is waited for or buffered, and the box is treated as broken (SB009). Before
authentication, a pod relay's challenge frame is capped at 4 KiB. The largest read the service
allows (a ``files.read_bytes`` of ``fileops.MAX_READ_BYTES``) still goes through a real agent.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from execbox.agent import fileops, protocol, pump
from execbox.boxes import agent_client as ac
from execbox.boxes.agent_client import MAX_REPLY_FRAME, AgentClient, BoxDied, PipeTransport, reply_frame_limit
from execbox.boxes.k8s_box import CHALLENGE_MAX_FRAME, connect_agent
from execbox.errors import InstanceCreationError

MiB = 1024 * 1024


class Flood:
    """A box that answers any request with a frame header announcing ``size`` bytes, then sends
    filler for as long as it is read (up to ``budget`` bytes, then nothing more: a timeout)."""

    def __init__(self, size: int, budget: int = 16 * MiB) -> None:
        self.size = size
        self.budget = budget
        self.sent = 0
        self.reads = 0
        self.requests: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.requests.append(data)

    def recv(self, max_bytes: int, timeout: float) -> bytes:
        self.reads += 1
        if self.sent >= self.budget:
            time.sleep(min(timeout, 0.05))
            raise TimeoutError
        head = protocol.HEADER.pack(self.size) if self.sent == 0 else b""
        chunk = head + b" " * (max_bytes - len(head))
        self.sent += len(chunk)
        return chunk

    def close(self) -> None:
        pass


def _b64_size(n: int) -> int:
    return 4 * -(-n // 3)


def test_the_cap_is_derived_from_the_agent_s_limits():
    # the largest reply: a read_bytes of the largest file, as base64, with room for its JSON
    assert MAX_REPLY_FRAME >= _b64_size(fileops.MAX_READ_BYTES) + MiB
    # an exec at the default output cap: stdout, stderr and result, each escaped up to 6x, plus artifacts
    assert MAX_REPLY_FRAME >= 3 * 6 * pump.DEFAULT_OUTPUT_CAP + _b64_size(pump.INLINE_ARTIFACT_CAP) + MiB
    # far below the agent's own bound, and near the largest legitimate reply
    assert MAX_REPLY_FRAME <= 96 * MiB < protocol.MAX_FRAME
    # an exec asking a larger output cap may get a larger reply, while it is outstanding
    assert reply_frame_limit("exec", {"output_cap": 64 * MiB}) >= 2 * 3 * 64 * MiB + _b64_size(pump.INLINE_ARTIFACT_CAP)
    assert reply_frame_limit("exec", {"output_cap": pump.DEFAULT_OUTPUT_CAP}) == MAX_REPLY_FRAME
    assert reply_frame_limit("files.read_bytes", {"output_cap": 64 * MiB}) == MAX_REPLY_FRAME
    assert reply_frame_limit("exec", {"output_cap": "huge"}) == MAX_REPLY_FRAME


@pytest.mark.parametrize("size", [MAX_REPLY_FRAME + 1, 200 * MiB, protocol.MAX_FRAME, 2**32 - 1])
def test_a_huge_announced_frame_is_refused_at_once_without_buffering(size):
    box = Flood(size)
    client = AgentClient(box, "box-x")
    tracemalloc.start()
    try:
        with pytest.raises(BoxDied) as e:
            client.call("ping", timeout=5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e.value.code == "SB009"
    assert e.value.details == {"box": "box-x", "frame_bytes": size, "limit": MAX_REPLY_FRAME}
    assert f"frame of {size} bytes" in e.value.message and "treated as broken" in e.value.message
    assert box.reads == 1 and box.sent <= ac.READ_CHUNK  # refused on the first read: no body waited for
    assert peak < 4 * MiB  # nothing of the announced size allocated
    # the box is broken from now on: the next request is refused without reading it again
    assert client.dead and "exceeds" in client.dead
    with pytest.raises(BoxDied):
        client.call("files.read_bytes", {"path": "x"}, timeout=5)
    assert box.reads == 1


def test_the_wait_for_the_ready_frame_is_capped_too():
    client = AgentClient(Flood(300 * MiB), "box-y")
    with pytest.raises(InstanceCreationError) as e:
        client.wait_ready(5)
    assert "frame of 314572800 bytes" in e.value.message


def test_a_frame_that_is_not_a_message_breaks_the_box():
    class Odd(Flood):
        def recv(self, max_bytes, timeout):
            self.reads += 1
            return protocol.encode_frame([1, 2])  # type: ignore[arg-type]

    client = AgentClient(Odd(0), "box-z")
    with pytest.raises(BoxDied) as e:
        client.call("ping", timeout=5)
    assert "not a message" in e.value.message and client.dead


def test_an_exec_with_a_larger_output_cap_raises_the_limit_while_it_is_outstanding():
    seen: list[int] = []

    class Echo(Flood):
        reply = b""

        def send(self, data):
            req = protocol.FrameBuffer().feed(data)[0]
            seen.append(client.frames.max_frame)
            self.reply = protocol.encode_frame({"id": req["id"], "ok": True, "value": req["op"]})

        def recv(self, max_bytes, timeout):
            out, self.reply = self.reply, b""
            if not out:
                raise TimeoutError
            return out

    client = AgentClient(Echo(0), "box-e")
    assert client.call("exec", {"output_cap": 64 * MiB}) == "exec"
    assert client.call("ping") == "ping"
    assert seen == [reply_frame_limit("exec", {"output_cap": 64 * MiB}), MAX_REPLY_FRAME]
    assert client.frames.max_frame == MAX_REPLY_FRAME and not client.wider


def test_the_largest_read_the_service_allows_still_goes_through(tmp_path: Path):
    """A real agent, a file of exactly ``MAX_READ_BYTES`` (64 MiB): its reply is ~85.4 MiB of base64."""
    ws = tmp_path / "ws"
    ws.mkdir()
    data = os.urandom(1 << 20) * (fileops.MAX_READ_BYTES >> 20)
    assert len(data) == fileops.MAX_READ_BYTES
    (ws / "big.bin").write_bytes(data)
    proc = subprocess.Popen([sys.executable, "-m", "execbox.agent", "--workspace", str(ws), "--preload", "none"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.stdin is not None and proc.stdout is not None
    try:
        client = AgentClient(PipeTransport(proc.stdin.fileno(), proc.stdout.fileno(), owns_fds=False), "big")
        client.wait_ready(30)
        got = client.call("files.read_bytes", {"path": "big.bin"}, timeout=120)
        assert got["size"] == len(data) and len(got["content_b64"]) == _b64_size(len(data))
        assert base64.b64decode(got["content_b64"]) == data
        assert not client.dead
    finally:
        proc.kill()
        proc.wait(timeout=10)


# -- the pre-auth challenge of a pod's relay ------------------------------------------------------


def _relay(frame_head: bytes, then: bytes = b"") -> tuple[socket.socket, threading.Thread]:
    """A listener that greets each connection with ``frame_head`` + ``then`` and then holds it open."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve():
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        with conn:
            try:
                conn.sendall(frame_head + then)
                conn.settimeout(5)
                conn.recv(1)  # hold the connection until the client gives up
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv, t


@pytest.mark.parametrize("size", [CHALLENGE_MAX_FRAME + 1, 64 * MiB])
def test_the_challenge_frame_is_capped_at_4_kib(size):
    srv, t = _relay(protocol.HEADER.pack(size), b"{" * min(size, 8192))
    try:
        started = time.monotonic()
        with pytest.raises(InstanceCreationError) as e:
            connect_agent("127.0.0.1", srv.getsockname()[1], "token", "pod-x", timeout=3)
        assert time.monotonic() - started < 2  # refused at once, not at the handshake's deadline
    finally:
        srv.close()
        t.join(10)
    assert CHALLENGE_MAX_FRAME == 4096
    assert f"frame of {size} bytes exceeds 4096" in e.value.message and e.value.details == {"pod": "pod-x"}


def test_a_first_frame_that_is_not_a_challenge_is_refused():
    srv, t = _relay(protocol.encode_frame({"event": "ready"}))
    try:
        with pytest.raises(InstanceCreationError) as e:
            connect_agent("127.0.0.1", srv.getsockname()[1], "token", "pod-y", timeout=3)
    finally:
        srv.close()
        t.join(10)
    assert "challenge" in e.value.message


def test_no_data_in_time_is_not_a_read_failure():
    """A transport's TimeoutError (an OSError) is the caller's to judge: an inline op that gets no
    reply in time reports the box busy and leaves it alive; an ordinary request says it timed out."""

    class Silent(Flood):
        def recv(self, max_bytes, timeout):
            self.reads += 1
            time.sleep(min(timeout, 0.05))
            raise TimeoutError

    client = AgentClient(Silent(0), "box-s")
    with pytest.raises(ac.ProviderUnavailableError) as e:
        client.call("ping", timeout=0.2)
    assert e.value.details.get("busy") is True and not client.dead
    with pytest.raises(InstanceCreationError) as e2:
        client.wait_ready(0.2)
    assert "did not become ready within" in e2.value.message and not client.dead
    with pytest.raises(BoxDied) as e3:
        client.call("exec", {}, timeout=0.2)
    assert "did not answer exec within" in e3.value.message and client.dead
