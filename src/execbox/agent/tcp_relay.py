"""TCP listen mode for the agent (Kubernetes pods): relay one authenticated gateway connection.

A pod has no stdin the gateway could hold open without the API server in the path, so the pod's
main process is this relay: it starts the ordinary agent (``execbox_agent.main``) as a child on
pipes, waits for its ready frame, then listens on ``--port``. A connection must answer an HMAC
challenge with the pod's secret (``EXECBOX_AGENT_TOKEN``, removed from the environment before
the agent starts) before any frame reaches the agent. One connection is current at a time; a newly
authenticated one replaces it, so another gateway replica can take a session over. Only whole
frames are relayed, so a connection dropped mid-frame never corrupts the agent's stream.

Stdlib only, like the rest of the agent. The relay never parses requests: execution stays in main.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import time

from . import procs, protocol

BOOT = ("import sys;sys.path.insert(0,sys.argv[1]);"
        "import importlib;importlib.import_module(sys.argv[2]).main(sys.argv[3:])")
AUTH_TIMEOUT = 5.0
SEND_TIMEOUT = 30.0
TOKEN_ENV = "EXECBOX_AGENT_TOKEN"


def auth_mac(token: bytes, nonce: str) -> str:
    """What a client must answer to the challenge ``nonce`` (shared with the host side)."""
    return hmac.new(token, nonce.encode("ascii"), hashlib.sha256).hexdigest()


def split_frames(buf: bytearray) -> list[bytes]:
    """Pop every complete raw frame (header included) from ``buf``."""
    out = []
    while len(buf) >= protocol.HEADER.size:
        (size,) = protocol.HEADER.unpack_from(buf)
        if size > protocol.MAX_FRAME:
            raise protocol.ProtocolError(f"frame of {size} bytes exceeds {protocol.MAX_FRAME}")
        end = protocol.HEADER.size + size
        if len(buf) < end:
            break
        out.append(bytes(buf[:end]))
        del buf[:end]
    return out


class Relay:
    def __init__(self, port: int, token: bytes, agent_argv: list[str]) -> None:
        self.token = token
        self.port = port
        self.child = subprocess.Popen(agent_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # noqa: S603
        assert self.child.stdin is not None and self.child.stdout is not None
        self.to_agent = self.child.stdin.fileno()
        self.from_agent = self.child.stdout.fileno()
        self.sel = selectors.DefaultSelector()
        self.listener: socket.socket | None = None
        self.current: socket.socket | None = None
        self.cur_buf = bytearray()
        self.pending: dict[socket.socket, tuple[str, float, bytearray]] = {}
        self.agent_buf = bytearray()
        self.ready_frame: bytes | None = None

    def _listen(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", self.port))  # noqa: S104 - a pod port; NetworkPolicy + HMAC guard it
        s.listen(16)
        s.setblocking(False)
        self.listener = s
        self.sel.register(s, selectors.EVENT_READ, "accept")

    def _drop(self, conn: socket.socket) -> None:
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        self.pending.pop(conn, None)
        if conn is self.current:
            self.current = None
            self.cur_buf.clear()
        conn.close()

    def _send(self, conn: socket.socket, data: bytes) -> bool:
        try:
            conn.setblocking(True)
            conn.settimeout(SEND_TIMEOUT)
            conn.sendall(data)
            conn.setblocking(False)
            return True
        except OSError:
            self._drop(conn)
            return False

    def _accept(self) -> None:
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        nonce = secrets.token_hex(16)
        if self._send(conn, protocol.encode_frame({"event": "challenge", "nonce": nonce})):
            self.pending[conn] = (nonce, time.monotonic() + AUTH_TIMEOUT, bytearray())
            self.sel.register(conn, selectors.EVENT_READ, "pending")

    def _auth(self, conn: socket.socket) -> None:
        nonce, _, buf = self.pending[conn]
        try:
            data = conn.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        buf += data
        try:
            frames = protocol.FrameBuffer().feed(bytes(buf[: protocol.HEADER.size + 4096]))
        except (protocol.ProtocolError, ValueError):
            frames = []
            buf.clear()
        if not frames:
            if len(buf) > 4096 + protocol.HEADER.size:
                self._drop(conn)
            return
        msg = frames[0]
        ok = msg.get("op") == "auth" and hmac.compare_digest(str(msg.get("mac", "")), auth_mac(self.token, nonce))
        if not ok:
            self._send(conn, protocol.encode_frame({"event": "auth_failed"}))
            self._drop(conn)
            return
        self.pending.pop(conn)
        if self.current is not None:
            self._drop(self.current)
        self.sel.modify(conn, selectors.EVENT_READ, "client")
        self.current = conn
        (size,) = protocol.HEADER.unpack_from(buf)
        assert self.ready_frame is not None
        if self._send(conn, self.ready_frame):
            self.cur_buf += buf[protocol.HEADER.size + size:]  # a request sent right behind the auth frame
            self._forward()

    def _from_client(self) -> None:
        conn = self.current
        assert conn is not None
        try:
            data = conn.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        self.cur_buf += data
        self._forward()

    def _forward(self) -> None:
        """Write every complete frame from the current client to the agent."""
        try:
            frames = split_frames(self.cur_buf)
        except protocol.ProtocolError:
            if self.current is not None:
                self._drop(self.current)
            return
        for frame in frames:
            view = memoryview(frame)
            while view:
                view = view[os.write(self.to_agent, view):]

    def _from_agent(self) -> bool:
        data = os.read(self.from_agent, 1 << 20)
        if not data:
            return False
        self.agent_buf += data
        for frame in split_frames(self.agent_buf):
            if self.ready_frame is None:
                self.ready_frame = frame
                self._listen()
            elif self.current is not None:
                self._send(self.current, frame)
        return True

    def run(self) -> int:
        self.sel.register(self.from_agent, selectors.EVENT_READ, "agent")
        while True:
            now = time.monotonic()
            for conn, (_, deadline, _) in list(self.pending.items()):
                if now > deadline:
                    self._drop(conn)
            for key, _ in self.sel.select(timeout=1.0):
                if key.data == "agent":
                    if not self._from_agent():
                        return self.child.wait()
                elif key.data == "accept":
                    self._accept()
                elif key.data == "pending" and key.fileobj in self.pending:
                    self._auth(key.fileobj)  # type: ignore[arg-type]
                elif key.data == "client" and key.fileobj is self.current:
                    self._from_client()


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    agent_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="execbox_agent.tcp_relay")
    parser.add_argument("--port", type=int, default=7070)
    parser.add_argument("--token-env", default=TOKEN_ENV)
    args = parser.parse_args(own)
    token = os.environ.pop(args.token_env, "").encode()
    if len(token) < 16:
        print(f"tcp_relay: {args.token_env} must hold the pod's secret (16+ chars)", file=sys.stderr)
        sys.exit(2)
    procs.set_dumpable(False)  # user code (same uid) must not read the secret through /proc
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    package = __package__ or "execbox_agent"
    relay = Relay(args.port, token, [sys.executable, "-I", "-c", BOOT, root, f"{package}.main", *agent_args])

    def stop(*_: object) -> None:  # as PID 1 the kernel ignores SIGTERM without a handler
        relay.child.kill()
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    sys.exit(relay.run())


if __name__ == "__main__":
    main()
