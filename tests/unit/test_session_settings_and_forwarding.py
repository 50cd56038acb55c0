"""New session settings parse strictly; forwarded-request signatures bind method, path, body and time;
only the session manager's own "owned elsewhere" error forwards a request, and only to a plain base URL."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from execbox.errors import InvalidConfigError, error_from_dict
from execbox.service.config import ServiceSettings
from execbox.service.errors import install_error_handlers
from execbox.service.forwarding import ForwardToOwner, sign, verify
from execbox.service.sessions.model import SessionOwnedElsewhere
from tests.unit.remote.http_server import ThreadedServer


def test_session_settings_from_env() -> None:
    s = ServiceSettings.from_env({"EXECBOX_REPLICA_ID": "r1", "EXECBOX_SESSION_LEASE": "5s",
                                  "EXECBOX_PAUSED_RETENTION": "2h", "SANDBOX_IDLE_ACTION": "pause",
                                  "EXECBOX_DRAIN_TIMEOUT": "1m", "EXECBOX_REPLICA_URL": "http://a:1"})
    assert (s.replica_id, s.lease_ttl, s.paused_retention, s.idle_action, s.drain_timeout, s.replica_url) == (
        "r1", 5.0, 7200.0, "pause", 60.0, "http://a:1")
    assert ServiceSettings.from_env({}).paused_retention == 86400.0
    with pytest.raises(InvalidConfigError) as e:
        ServiceSettings.from_env({"SANDBOX_IDLE_ACTION": "explode"})
    assert e.value.details["field"] == "SANDBOX_IDLE_ACTION"


def test_forwarding_signature_binds_everything() -> None:
    stamp = f"{time.time():.3f}"
    mac = sign("k", "ra", stamp, "POST", "/v1/sandbox/read", b'{"a":1}')
    header = f"ra:{stamp}:{mac}"
    assert verify("k", header, "POST", "/v1/sandbox/read", b'{"a":1}')
    assert not verify("other", header, "POST", "/v1/sandbox/read", b'{"a":1}')  # wrong secret
    assert not verify("k", header, "POST", "/v1/sandbox/write", b'{"a":1}')  # another path
    assert not verify("k", header, "POST", "/v1/sandbox/read", b'{"a":2}')  # another body
    assert not verify("k", header, "POST", "/v1/sandbox/read", b'{"a":1}', now=time.time() + 120)  # stale
    assert not verify("k", "garbage", "POST", "/", b"")


def test_replica_url_must_be_a_plain_base_url() -> None:
    for bad in ("http://h/x", "http://h/?", "http://u:p@h:1", "ftp://h", "http://h#f", "h:1"):
        with pytest.raises(InvalidConfigError) as e:
            ServiceSettings.from_env({"EXECBOX_REPLICA_URL": bad})
        assert e.value.details["field"] == "EXECBOX_REPLICA_URL"
    assert ServiceSettings.from_env({"EXECBOX_REPLICA_URL": "https://r2.internal:8080/"}).replica_url


def _app_with_forwarding(raise_it: Any) -> Any:
    app = FastAPI()
    install_error_handlers(app)
    counter = SimpleNamespace(labels=lambda code: SimpleNamespace(inc=lambda: None))
    app.state.services = SimpleNamespace(metrics=SimpleNamespace(errors=counter))

    @app.post("/v1/sandbox/execute")
    async def execute() -> None:
        raise_it()

    return ForwardToOwner(app, replica="ra", secret="s3cret")


def _post(app: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ra") as c:
            return await c.post("/v1/sandbox/execute", json={"code": "print(1)"},
                                headers={"Authorization": "Bearer ebx_tenant_token"})
    return asyncio.run(go())


@pytest.fixture
def listener() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A server that records what reaches it (standing in for a replica, or an attacker's host)."""
    seen: list[dict[str, Any]] = []
    app = FastAPI()

    @app.post("/{path:path}")
    async def anything(path: str, request: Request) -> dict[str, str]:
        seen.append({"path": path, "auth": request.headers.get("authorization")})
        return {"stdout": "served there"}

    srv = ThreadedServer(app)
    srv.start()
    try:
        yield srv.url, seen
    finally:
        srv.stop()


def test_an_error_from_a_wire_never_steers_forwarding(listener: tuple[str, list[dict[str, Any]]]) -> None:
    """A remote executor's or cloud sandbox's error naming an ``owner_url`` is only an error: the
    caller's request and token are not replayed there (only SessionOwnedElsewhere forwards)."""
    url, seen = listener
    foreign = error_from_dict({"error": {"code": "SB009", "message": "moved",
                                         "details": {"owner": "rx", "owner_url": url}}}, 503)

    def raise_foreign() -> None:
        raise foreign

    r = _post(_app_with_forwarding(raise_foreign))
    assert r.status_code == 503 and r.json()["error"]["code"] == "SB009"
    assert "x-execbox-served-by" not in r.headers and seen == []

    def raise_owned() -> None:  # the positive control: the session manager's own error is forwarded
        raise SessionOwnedElsewhere("served by rb", forward_to=url, details={"owner": "rb", "owner_url": url})

    r = _post(_app_with_forwarding(raise_owned))
    assert r.status_code == 200 and r.json() == {"stdout": "served there"}
    assert r.headers["x-execbox-served-by"] == url and seen == [{"path": "v1/sandbox/execute",
                                                                "auth": "Bearer ebx_tenant_token"}]

    def raise_owned_with_path() -> None:  # a registered URL that would change the path is not used
        raise SessionOwnedElsewhere("served by rb", forward_to=url + "/internal/admin?", details={"owner": "rb"})

    r = _post(_app_with_forwarding(raise_owned_with_path))
    assert r.status_code == 503 and len(seen) == 1


@pytest.mark.parametrize("secret", ["s3cret", ""])
def test_a_run_forwarded_to_its_owner_is_not_recorded_as_an_error_here(local_provider, tmp_path, monkeypatch,
                                                                      secret: str) -> None:
    """The owner counts and audits a forwarded run; this replica recorded it too, as SB009. Without
    forwarding (no secret) the SB009 is the caller's answer, and is recorded."""
    from contextlib import contextmanager

    from execbox.service.executions import RunService, RunSpec
    from execbox.service.logs import OperationLog
    from execbox.service.metrics import ServiceMetrics
    from execbox.service.sessions import SessionManager
    from tests.integration.service.conftest import Holder

    monkeypatch.setenv("EXECBOX_INTERNAL_SECRET", secret)
    sessions = SessionManager(Holder(local_provider), ServiceSettings(), str(tmp_path), None)

    @contextmanager
    def owned_elsewhere(*a: Any, **kw: Any) -> Iterator[Any]:
        raise SessionOwnedElsewhere("served by rb", forward_to="http://10.0.0.2:8080", details={"owner": "rb"})
        yield

    monkeypatch.setattr(sessions, "session", owned_elsewhere)
    runs = RunService(sessions, ServiceMetrics(), OperationLog(None, False))
    recorded: list[str] = []
    monkeypatch.setattr(runs, "_record", lambda *a, **kw: recorded.append(a[4]))
    spec = RunSpec("t", "s", "execute_code", "python", "print(1)", None, lambda *a: None)
    with pytest.raises(SessionOwnedElsewhere):
        runs.run(spec)
    with pytest.raises(SessionOwnedElsewhere):
        runs.file_op("t", "s", "read_file", "f.txt", None, lambda p, i: None)
    assert recorded == ([] if secret else ["error", "error"])
    sessions.shutdown()


class _DyingOwner:
    """A raw HTTP server that reads a request, then dies: before answering, or mid-event-stream."""

    def __init__(self, stream: bool) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stream = stream
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            if self.stream:
                head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                event = b"event: stdout\ndata: \"half\"\n\n"
                conn.sendall(head + f"{len(event):x}\r\n".encode() + event + b"\r\n")
                time.sleep(0.2)
            conn.shutdown(socket.SHUT_RDWR)  # gone: no answer, or no end of the stream


@pytest.mark.parametrize("stream", [False, True])
def test_an_owner_that_dies_mid_request_is_reported_as_outcome_unknown(stream: bool) -> None:
    owner = _DyingOwner(stream)

    def raise_owned() -> None:
        raise SessionOwnedElsewhere("served by rb", forward_to=owner.url, details={"owner": "rb"})

    r = _post(_app_with_forwarding(raise_owned))
    assert "x-execbox-forward-to" not in r.headers
    if stream:  # the owner's events so far, then an error event instead of a silent end
        assert r.status_code == 200 and 'event: stdout\ndata: "half"' in r.text
        assert r.text.rstrip().endswith('"details": {"reason": "owner_lost_mid_request"}}')
    else:
        assert r.status_code == 503 and "retry-after" not in r.headers
        assert r.json()["error"]["details"] == {"reason": "owner_lost_mid_request"}


def test_the_owner_s_address_is_not_shown_to_the_caller_when_not_forwarding() -> None:
    def raise_owned() -> None:
        raise SessionOwnedElsewhere("served by rb", forward_to="http://10.0.0.2:8080", details={"owner": "rb"})

    app = _app_with_forwarding(raise_owned)
    app.secret = ""  # no shared secret: no forwarding, the SB009 is the answer
    r = _post(app)
    assert r.status_code == 503 and "x-execbox-forward-to" not in r.headers
