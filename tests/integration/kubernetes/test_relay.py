"""The agent's TCP listen mode (agent/tcp_relay.py) as a local process: auth, takeover, bad input."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from execbox.agent import protocol
from execbox.boxes.box import AGENT_BOOT, agent_source_dir
from execbox.boxes.k8s_box import connect_agent
from execbox.errors import InstanceCreationError

TOKEN = "relay-test-token-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def relay(tmp_path):
    port = _free_port()
    root = os.path.dirname(agent_source_dir())  # .../execbox: the package is importable as `agent`
    env = {"PATH": os.environ["PATH"], "EXECBOX_AGENT_TOKEN": TOKEN, "TMPDIR": str(tmp_path)}  # not the host's /tmp
    proc = subprocess.Popen([sys.executable, "-I", "-c", AGENT_BOOT, root, "agent.tcp_relay", "--port", str(port),  # noqa: S603
                             "--", "--workspace", str(tmp_path / "ws"), "--preload", "none", "--limits", "{}"],
                            env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()
            time.sleep(0.05)
    yield port
    proc.terminate()
    assert proc.wait(timeout=10) == 143  # SIGTERM ends relay and agent (as PID 1 it needs a handler)


def _run(client, code):
    return client.call("exec", {"language": "python", "code": code, "timeout": 10, "output_cap": 4096,
                                "stream": False, "inline_artifacts": False}, timeout=20)


def test_secret_is_required_and_hidden_from_user_code(relay):
    with pytest.raises(InstanceCreationError, match="handshake failed"):
        connect_agent("127.0.0.1", relay, "wrong-token-0123456789", "box")
    c = connect_agent("127.0.0.1", relay, TOKEN, "box")
    assert _run(c, "import os\nprint(os.environ.get('EXECBOX_AGENT_TOKEN'))")["stdout"] == "None\n"


def test_garbage_and_half_frames_never_reach_the_agent(relay):
    c = connect_agent("127.0.0.1", relay, TOKEN, "box")
    _run(c, "print('warm')")
    s = socket.create_connection(("127.0.0.1", relay))  # unauthenticated: junk, then a huge length
    s.sendall(b"\xff\xff\xff\xffnot json at all")
    s.close()
    half = connect_agent("127.0.0.1", relay, TOKEN, "half")  # takes over, then dies mid-frame
    frame = protocol.encode_frame({"id": 99, "op": "exec", "language": "python", "code": "print('half')"})
    half.transport.send(frame[: len(frame) // 2])
    half.close()
    fresh = connect_agent("127.0.0.1", relay, TOKEN, "fresh")
    assert _run(fresh, "print('intact')")["stdout"] == "intact\n"


def test_a_new_connection_takes_over(relay):
    a = connect_agent("127.0.0.1", relay, TOKEN, "a")
    _run(a, "print(1)")
    b = connect_agent("127.0.0.1", relay, TOKEN, "b")
    assert _run(b, "print(2)")["stdout"] == "2\n"
    with pytest.raises(Exception):  # noqa: B017 - the replaced connection is closed: BoxDied
        _run(a, "print(3)")


def test_a_request_right_behind_the_auth_frame_is_served(relay):
    from execbox.agent.tcp_relay import auth_mac

    s = socket.create_connection(("127.0.0.1", relay))
    buf = protocol.FrameBuffer()
    (challenge,) = buf.feed(s.recv(4096))
    s.sendall(protocol.encode_frame({"op": "auth", "mac": auth_mac(TOKEN.encode(), challenge["nonce"])})
              + protocol.encode_frame({"id": 1, "op": "files.list", "path": "."}))
    got = []
    while len(got) < 2:
        got += buf.feed(s.recv(65536))
    s.close()
    assert got[0]["event"] == "ready" and got[1]["id"] == 1 and got[1]["ok"], got
