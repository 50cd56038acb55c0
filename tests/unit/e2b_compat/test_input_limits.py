"""Bad input to the service and the E2B facade is a clear 4xx, never a 500, and bounded.

Pure pieces (no box): the sandbox-URL routing headers, JSON parsing, echoed values, context cwd,
the request body limit as ASGI middleware in front of a non-FastAPI app, the agent client's
frame encoding, request models, the new setting, and the sandbox registry's view of a session
destroyed under it.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from execbox.errors import InvalidConfigError
from execbox.service.config import ServiceSettings
from execbox.service.e2b_compat.code_contexts import _cwd
from execbox.service.e2b_compat.registry import E2BSandbox, Registry
from execbox.service.e2b_compat.sandbox_http import clip, parse_json, sandbox_of
from execbox.service.e2b_compat.templates import TemplateRefused, runtime_for
from execbox.service.errors import BodyLimit
from execbox.service.metrics import ServiceMetrics


def _scope(**headers: str) -> dict[str, Any]:
    return {"type": "http", "headers": [(k.replace("_", "-").encode(), v.encode("latin-1"))
                                        for k, v in headers.items()]}


@pytest.mark.parametrize("port", ["9" * 5000, "\u00b2", "12\u00b3", "-1", "abc", "49983 ", "0x10"])
def test_a_bad_sandbox_port_header_is_no_port(port: str) -> None:
    assert sandbox_of(_scope(e2b_sandbox_id="abc", e2b_sandbox_port=port), None) == ("abc", -1)


def test_a_sandbox_port_header_and_host_name_route() -> None:
    assert sandbox_of(_scope(e2b_sandbox_id="abc", e2b_sandbox_port="49999"), None) == ("abc", 49999)
    assert sandbox_of(_scope(host="49983-abc.sb.example"), "sb.example") == ("abc", 49983)
    assert sandbox_of(_scope(host=("9" * 5000) + "-abc.sb.example"), "sb.example") is None


def test_deep_or_malformed_json_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_json(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_json(b"{oops")
    assert parse_json(b'{"a": [1]}') == {"a": [1]}


def test_echoed_values_are_clipped() -> None:
    assert clip("a" * 10) == "a" * 10
    long = clip("x" * 10_000)
    assert len(long) == 65 and long.endswith("\u2026")
    with pytest.raises(TemplateRefused) as e:
        runtime_for("t" * 10_000, SimpleNamespace(name="local"))
    assert len(e.value.message) < 300


@pytest.mark.parametrize(("given", "shown"), [
    (None, "/home/user"), ("", "/home/user"), ("/home/user", "/home/user"), ("sub/dir", "/home/user/sub/dir"),
    ("/home/user/a/../b", "/home/user/b"),
])
def test_context_cwd_is_a_workspace_path(given: Any, shown: str) -> None:
    assert _cwd(given) == shown


@pytest.mark.parametrize("bad", [{"a": 1}, 5, ["x"], "/etc", "../up", "a\0b", "x" * 30_000])
def test_context_cwd_outside_the_workspace_or_not_a_string_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError) as e:
        _cwd(bad)
    assert len(str(e.value)) < 300  # never the 30,000 characters back


def _asgi(app: Any, body_chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []
    chunks = list(body_chunks)

    async def receive() -> dict[str, Any]:
        chunk = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/files", "headers": headers}
    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


async def _reads_everything(scope: Any, receive: Any, send: Any) -> None:
    """An app outside FastAPI (like the E2B sandbox router's handlers): it reads the whole body."""
    total = 0
    while True:
        message = await receive()
        total += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(total).encode()})


def test_body_limit_bounds_a_streamed_body_for_any_app() -> None:
    limited = BodyLimit(_reads_everything, max_bytes=1000, metrics=ServiceMetrics())
    status, body = _asgi(limited, [b"x" * 600, b"x" * 600, b"x" * 600], [])
    assert status == 413 and json.loads(body)["error"]["code"] == "SB002"
    status, _ = _asgi(limited, [b"x"], [(b"content-length", b"5000")])
    assert status == 413  # refused from the declared length, before reading
    status, _ = _asgi(limited, [b"x"], [(b"content-length", b"9" * 5000)])
    assert status == 413
    assert _asgi(limited, [b"x" * 500, b"x" * 500], []) == (200, b"1000")


class _Sink:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    def recv(self, max_bytes: int, timeout: float) -> bytes:
        raise TimeoutError

    def close(self) -> None:
        pass


def test_agent_client_refuses_a_lone_surrogate_as_sb002() -> None:
    from execbox.boxes.agent_client import AgentClient

    sink = _Sink()
    client = AgentClient(sink, "box")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError) as e:
        client.call("exec", {"code": "#\ud800", "env": {"X": "ok"}}, timeout=0.1)
    assert e.value.http_status == 400 and e.value.details["field"] == "code"
    with pytest.raises(InvalidConfigError) as e:
        client.call("exec", {"code": "1", "env": {"X": "\udfff"}}, timeout=0.1)
    assert e.value.details["field"] == "env.X"
    assert sink.sent == [] and client.dead is None and client.mail == {}  # nothing sent, box fine


@pytest.mark.parametrize(("model", "body", "field"), [
    ("WriteRequest", {"session_id": "s", "path": "a", "content": "\ud800"}, "content"),
    ("ExecuteRequest", {"code": "#\ud800"}, "code"),
    ("BashRequest", {"command": "true", "env": {"X": "\ud800"}}, "env"),
    ("BashRequest", {"command": "true", "env": {"\ud800": "x"}}, "env"),
    ("CopyRequest", {"files": [{"path": "a", "content": "\udfff"}]}, "files"),
])
def test_request_models_refuse_lone_surrogates(model: str, body: dict[str, Any], field: str) -> None:
    from pydantic import ValidationError

    from execbox.service import schemas

    with pytest.raises(ValidationError) as e:
        getattr(schemas, model)(**body)
    assert e.value.errors()[0]["loc"][0] == field
    assert schemas.ExecuteRequest(code="print('\u00e9 \U0001f600')").code  # real non-ASCII text is fine


def test_max_background_processes_setting() -> None:
    assert ServiceSettings().max_background_processes == 32
    assert ServiceSettings.from_env({"SANDBOX_MAX_BACKGROUND_PROCESSES": "5"}).max_background_processes == 5
    with pytest.raises(InvalidConfigError):
        ServiceSettings.from_env({"SANDBOX_MAX_BACKGROUND_PROCESSES": "0"})


class _Sessions:
    """What the E2B registry reads of the session manager: this replica's table and the registry."""

    def __init__(self) -> None:
        self.local: dict[tuple[str, str], Any] = {}
        self.rows: dict[tuple[str, str], Any] = {}
        self.destroyed: list[tuple[str, str]] = []
        self.registry = SimpleNamespace(get=lambda t, s: self.rows.get((t, s)))
        self.settings = SimpleNamespace(idle_timeout=900)

    def get(self, tenant_id: str, session_id: str) -> Any:
        return self.local.get((tenant_id, session_id))

    def destroy(self, tenant_id: str, session_id: str) -> None:
        self.destroyed.append((tenant_id, session_id))
        self.local.pop((tenant_id, session_id), None)


def test_a_sandbox_whose_session_was_destroyed_is_gone() -> None:
    import time

    sessions = _Sessions()
    reg = Registry(sessions)  # type: ignore[arg-type]
    reg.start = lambda: None  # type: ignore[method-assign] - no sweeper thread here
    sb = E2BSandbox("abc", "alpha", "base", {}, {}, time.time() + 60, session_created=100.0)
    key = ("alpha", "e2b-abc")
    sessions.local[key] = SimpleNamespace(created_at=100.0, closed=False)
    reg.add(sb)
    assert reg.get("abc") is sb and reg.of_tenant("alpha") == [sb]
    del sessions.local[key]  # paused or another replica's: the registry row keeps it alive
    sessions.rows[key] = SimpleNamespace(created_at=100.0)
    assert reg.get("abc") is sb
    del sessions.rows[key]  # destroyed (admin DELETE): the sandbox is gone, not recreated
    assert reg.get("abc") is None and reg.of_tenant("alpha") == [] and reg.owned("abc", "alpha") is None

    sb2 = E2BSandbox("def", "alpha", "base", {}, {}, time.time() + 60, session_created=100.0)
    reg.add(sb2)
    sessions.local[("alpha", "e2b-def")] = SimpleNamespace(created_at=200.0, closed=False)  # a new incarnation
    assert reg.get("def") is None
    deadline = time.monotonic() + 5
    while ("alpha", "e2b-def") not in sessions.destroyed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ("alpha", "e2b-def") in sessions.destroyed  # the stray session a request made is removed


def _left_unread(app: Any, body_chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> tuple[int, int]:
    """(status, chunks of the body the app and the middleware never read)."""
    chunks = list(body_chunks)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        chunk = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app({"type": "http", "method": "POST", "path": "/files", "headers": headers}, receive, send))
    return next(m["status"] for m in sent if m["type"] == "http.response.start"), len(chunks)


def test_body_limit_reads_the_rest_of_a_body_before_its_413_so_the_writer_sees_the_answer() -> None:
    """A client still writing (the E2B SDK uploading 65 MiB) reads a 413 only if the server took
    the body; unread, the connection is reset under it. Taken and dropped, within a bound."""
    limited = BodyLimit(_reads_everything, max_bytes=1000, metrics=ServiceMetrics())
    body = [b"x" * 500] * 6  # 3000 bytes, within 4 x the limit
    assert _left_unread(limited, body, [(b"content-length", b"3000")]) == (413, 0)
    assert _left_unread(limited, body, []) == (413, 0)  # streamed: counted past the limit, then drained
    huge = [b"x" * 500] * 20  # 10000 bytes: more than 4 x the limit is not read, only refused
    status, left = _left_unread(limited, huge, [(b"content-length", b"10000")])
    assert status == 413 and left == 20
