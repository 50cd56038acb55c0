"""What a client buffers from a server is bounded: reply bodies, SSE lines and events (SDK,
self_managed), the cloud agent's output lines, and run output (the agent's own 1 MiB cap applied
again to output from a remote party, ``truncated`` set)."""

from __future__ import annotations

import json
import socket
import time
import tracemalloc

import pytest

from execbox import RemoteSandbox
from execbox.errors import ConnectionFailedError, ProviderUnavailableError, SandboxError
from execbox.providers import remote_agent, self_managed
from execbox.providers.remote_agent import RemoteAgent
from execbox.providers.self_managed import SelfManagedProvider

from .client_fakes import RawServer, answer

MiB = 1024 * 1024
CAP = 1024 * 1024  # the agent's default output cap (agent/pump.DEFAULT_OUTPUT_CAP)


def declares_huge_body(srv: RawServer, conn: socket.socket, *_) -> None:
    """Announces 200 MiB, sends a little, hangs up: refused from the header, nothing buffered."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 209715200\r\n\r\n"
                 b'{"stdout": "')


def chunked(body: bytes):
    def handle(srv: RawServer, conn: socket.socket, *_) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(body), 65536):
            part = body[i:i + 65536]
            conn.sendall(f"{len(part):x}\r\n".encode() + part + b"\r\n")
        conn.sendall(b"0\r\n\r\n")

    return handle


# -- the SDK ---------------------------------------------------------------------------------------


def test_sdk_refuses_a_body_announced_over_the_default_limit(serve):
    srv = serve(declares_huge_body)
    with pytest.raises(ConnectionFailedError, match=r"limit of 134217728 bytes") as e:
        RemoteSandbox(srv.url, "tok", tenant_id="t").run_code("print(1)")
    assert e.value.details["limit_bytes"] == 128 * MiB


def test_sdk_refuses_a_chunked_body_over_its_limit(serve):
    body = json.dumps({"stdout": "A" * 200_000, "stderr": "", "exit_code": 0}).encode()
    srv = serve(chunked(body))
    with pytest.raises(ConnectionFailedError, match="limit of 65536 bytes"):
        RemoteSandbox(srv.url, "tok", tenant_id="t", max_response_bytes=65536).run_code("print(1)")


def test_sdk_refuses_an_sse_line_that_never_ends(serve):
    srv = serve(chunked(b"event: stdout\ndata: " + b"A" * 500_000))
    with pytest.raises(ConnectionFailedError, match="line of the event stream.*limit of 65536"):
        RemoteSandbox(srv.url, "tok", tenant_id="t", max_response_bytes=65536).run_code(
            "print(1)", on_output=lambda s, t: None)


def test_sdk_refuses_an_sse_event_built_from_many_data_lines(serve):
    lines = b"".join(b"data: " + b"1" * 1000 + b"\n" for _ in range(200))
    srv = serve(chunked(b"event: result\n" + lines + b"\n"))
    with pytest.raises(ConnectionFailedError, match="one event of the stream.*limit of 65536"):
        RemoteSandbox(srv.url, "tok", tenant_id="t", max_response_bytes=65536).run_code(
            "print(1)", on_output=lambda s, t: None)


def test_sdk_within_its_limits_still_works(serve):
    result = {"stdout": "hi\n", "stderr": "", "exit_code": 0, "execution_time": 0.1}
    stream = (b": execbox stream\n\nevent: stdout\ndata: {\"text\": \"hi\\n\"}\n\n"
              b"event: result\r\ndata: " + json.dumps(result).encode() + b"\r\n\r\n")
    srv = serve(chunked(stream))
    seen: list[str] = []
    r = RemoteSandbox(srv.url, "tok", tenant_id="t", max_response_bytes=65536).run_code(
        "print('hi')", on_output=lambda s, t: seen.append(t))
    assert r.stdout == "hi\n" and seen == ["hi\n"]


# -- self_managed (/run) ------------------------------------------------------------------------------


def _provider(url: str) -> tuple[SelfManagedProvider, str]:
    p = SelfManagedProvider()
    p.initialize({"endpoint": url, "max_retries": 0})
    return p, p.create_instance().instance_id


def test_self_managed_refuses_a_body_announced_over_the_limit(serve):
    p, inst = _provider(serve(declares_huge_body).url)
    with pytest.raises(ProviderUnavailableError, match="limit of 134217728 bytes"):
        p.execute_code(inst, "print(1)", "python", 5)


def test_self_managed_refuses_a_chunked_body_over_the_limit(serve, monkeypatch):
    monkeypatch.setattr(self_managed, "MAX_RESPONSE_BYTES", 65536)
    body = json.dumps({"status": "success", "stdout": "A" * 200_000}).encode()
    p, inst = _provider(serve(chunked(body)).url)
    with pytest.raises(ProviderUnavailableError, match="limit of 65536 bytes"):
        p.execute_code(inst, "print(1)", "python", 5)


def test_self_managed_output_gets_the_agents_cap(serve):
    body = {"status": "success", "stdout": "é" * CAP, "stderr": "E" * (3 * CAP), "exit_code": 0}
    p, inst = _provider(serve(answer(json.dumps(body))).url)
    r = p.execute_code(inst, "print(1)", "python", 5)
    assert r.truncated is True
    assert len(r.stdout.encode()) <= CAP and r.stdout.startswith("éé")
    assert len(r.stderr.encode()) == CAP


def test_self_managed_small_output_is_not_marked_truncated(serve):
    p, inst = _provider(serve(answer(json.dumps({"status": "success", "stdout": "ok\n"}))).url)
    r = p.execute_code(inst, "print(1)", "python", 5)
    assert r.stdout == "ok\n" and r.truncated is False


# -- the agent in a cloud sandbox (remote_agent) --------------------------------------------------------


class CannedTransport:
    """A cloud sandbox whose agent (tenant code may have replaced it) prints ``stdout``."""

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout

    def upload(self, files: dict[str, bytes]) -> None:
        pass

    def run(self, argv, timeout, on_stdout):
        if on_stdout is not None:
            for i in range(0, len(self.stdout), 65536):
                on_stdout(self.stdout[i:i + 65536])
        return self.stdout, ""


def _exec_reply(**fields) -> str:
    value = {"stdout": "", "stderr": "", "exit_code": 0, "execution_time": 0.01, "language": "python", **fields}
    return json.dumps({"ok": True, "value": value}) + "\n"


def test_cloud_run_output_gets_the_agents_cap():
    agent = RemoteAgent(CannedTransport(_exec_reply(stdout="x" * (2 * CAP), stderr="y" * 10)), "/home/user", "test")
    r = agent.execute({"code": "print(1)", "language": "python"}, 5, {}, None, False, lambda p: b"")
    assert len(r.stdout) == CAP and r.stderr == "y" * 10 and r.truncated is True


def test_cloud_streamed_output_is_capped_per_stream():
    event = json.dumps({"event": "stdout", "data": "z" * 65536}) + "\n"
    seen: list[int] = []
    agent = RemoteAgent(CannedTransport(event * 40 + _exec_reply(stdout="z")), "/home/user", "test")
    agent.execute({"code": "print(1)", "language": "python"}, 5, {}, lambda s, t: seen.append(len(t)), False,
                  lambda p: b"")
    assert sum(seen) == CAP


def test_cloud_line_reader_does_not_buffer_a_line_that_never_ends():
    seen: list[str] = []
    reader = remote_agent._LineReader(lambda s, t: seen.append(t))
    chunk = "A" * 65536
    tracemalloc.start()
    try:
        for _ in range(128):  # 8 MiB, no newline
            reader.feed(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MiB
    reader.feed("\n" + json.dumps({"event": "stdout", "data": "after"}) + "\n")
    assert seen == ["after"]


def test_cloud_reply_line_over_the_frame_limit_is_refused(monkeypatch):
    monkeypatch.setattr(remote_agent, "reply_frame_limit", lambda op, params: 4096)
    agent = RemoteAgent(CannedTransport(json.dumps({"ok": True, "value": "v" * 10_000}) + "\n"), "/home/user", "test")
    with pytest.raises(ProviderUnavailableError, match="4096-byte reply limit"):
        agent.call("read", {"path": "x"})


@pytest.mark.parametrize("error", ["boom", ["x"], {"code": "SB002", "details": "not a dict", "status": "x"}])
def test_cloud_agent_malformed_error_reply_is_typed(error):
    agent = RemoteAgent(CannedTransport(json.dumps({"ok": False, "error": error}) + "\n"), "/home/user", "test")
    with pytest.raises(SandboxError) as e:
        agent.call("read", {"path": "x"})
    assert e.value.code == ("SB002" if isinstance(error, dict) else "SB009")


def test_self_managed_holds_at_most_pool_size_connections():
    """pool_size caps this client's connections (httpx ignored the limits given with a transport,
    so every concurrent run opened a connection of its own)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    peers: set[tuple[str, int]] = set()
    lock = threading.Lock()

    class Slow(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            with lock:
                peers.add(self.client_address)
            time.sleep(0.2)
            body = json.dumps({"status": "success", "stdout": "ok\n", "exit_code": 0}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    p = SelfManagedProvider()
    p.initialize({"endpoint": f"http://127.0.0.1:{srv.server_address[1]}", "max_retries": 0, "pool_size": 2})
    try:
        inst = p.create_instance().instance_id
        with ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(lambda _: p.execute_code(inst, "print(1)", "python", 5).stdout, range(8)))
        assert outs == ["ok\n"] * 8 and len(peers) <= 2, peers
    finally:
        p.shutdown()
        srv.shutdown()
