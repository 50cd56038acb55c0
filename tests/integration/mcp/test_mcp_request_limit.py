"""One MCP request is bounded by EXECBOX_MCP_MAX_REQUEST_BYTES, refused in execbox's words (review 42,
finding 1), on a real `execbox serve` (jail boxes):

- a body over the limit (declared, or counted while a chunked body streams) is HTTP 413 with a
  JSON-RPC error the SDK client raises as itself: ``SB002: ...`` naming the size, the limit, the
  setting and how to send less, and ``data`` with the numbers; it was the SDK transport's bare
  text/plain "Request body too large", which the SDK client reports as "Server returned an error
  response";
- the setting moves the limit, the SDK is given the same value, and a file larger than it is written
  in pieces with ``mode: "append"`` as the refusal and the write_file description say;
- a bad value stops the start.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from typing import Any

import httpx
import pytest

from execbox.errors import InvalidConfigError
from tests.integration.mcp.conftest import http_client, run_async
from tests.integration.service.conftest import start_service

pytestmark = pytest.mark.jail

ENV = "EXECBOX_MCP_MAX_REQUEST_BYTES"
DEFAULT = 4 * 1024 * 1024
SMALL = 64 * 1024


async def _error(c: Any, name: str, args: dict[str, Any]) -> Any:
    from mcp.shared.exceptions import MCPError

    try:
        return await c.call_tool(name, args)
    except MCPError as e:
        return e


def _sb002(err: Any, limit: int) -> None:
    assert type(err).__name__ == "MCPError", err
    message = err.error.message
    assert message.startswith("SB002: "), message
    assert f"{limit}-byte limit" in message and ENV in message and "mode='append'" in message, message
    data = err.error.data
    assert data["code"] == "SB002" and data["limit"] == limit and data["setting"] == ENV, data


def test_an_oversized_call_is_an_sb002_naming_the_limit(service) -> None:
    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_a) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            out: dict[str, Any] = {
                "big": await _error(c, "write_file", {"session_id": sid, "path": "big.txt",
                                                      "content": "a" * (DEFAULT + 1)}),
                "after": await c.call_tool("write_file", {"session_id": sid, "path": "ok.txt", "content": "ok"}),
                "listed": await c.call_tool("glob", {"session_id": sid, "pattern": "*.txt"})}
            await c.call_tool("close_session", {"session_id": sid})
            return out

    out = run_async(go)
    _sb002(out["big"], DEFAULT)
    assert out["big"].error.data["size"] > DEFAULT
    assert not out["after"].is_error  # the connection and the MCP session go on
    assert out["listed"].structured_content["paths"] == ["ok.txt"]  # nothing of the refused call was done


def test_raw_oversized_bodies_get_json_413s(service) -> None:
    url, headers = service.url + "/mcp", {"Authorization": f"Bearer {service.tenant_a}",
                                          "Accept": "application/json, text/event-stream",
                                          "Content-Type": "application/json"}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": "run_code", "arguments": {"code": "#" * (5 * 1000 * 1000)}}}).encode()
    declared = httpx.post(url, content=body, headers=headers, timeout=60)

    def chunks():
        for i in range(0, len(body), 65536):
            yield body[i:i + 65536]

    chunked = httpx.post(url, content=chunks(), headers=headers, timeout=60)
    unauthenticated = httpx.post(url, content=body, headers={**headers, "Authorization": "Bearer nope"}, timeout=60)
    for r, size in ((declared, len(body)), (chunked, None)):
        assert r.status_code == 413 and r.headers["content-type"] == "application/json", r.text
        payload = r.json()
        assert payload["jsonrpc"] == "2.0" and payload["id"] is None, payload
        assert payload["error"]["message"].startswith("SB002: ") and ENV in payload["error"]["message"]
        assert payload["error"]["data"] == {"code": "SB002", "reason": "mcp_request_too_large", "size": size,
                                            "limit": DEFAULT, "setting": ENV}
    assert unauthenticated.status_code == 401  # authentication comes first


def test_the_setting_moves_the_limit_and_append_writes_a_larger_file(sci_jail, monkeypatch) -> None:
    monkeypatch.setenv(ENV, str(SMALL))
    svc = start_service(sci_jail)
    data = os.urandom(3 * SMALL)
    piece = 30000  # a multiple of 3: each piece is base64 on its own

    async def go() -> dict[str, Any]:
        async with http_client(svc.url, svc.tenant_a) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            out: dict[str, Any] = {"whole": await _error(c, "write_file", {
                "session_id": sid, "path": "f.bin", "encoding": "base64", "content": base64.b64encode(data).decode()})}
            for i in range(0, len(data), piece):
                r = await c.call_tool("write_file", {
                    "session_id": sid, "path": "f.bin", "encoding": "base64", "mode": "append" if i else "overwrite",
                    "content": base64.b64encode(data[i:i + piece]).decode()})
                assert not r.is_error, r
            out["sum"] = await c.call_tool("run_command", {"session_id": sid, "command": "sha256sum f.bin"})
            await c.call_tool("close_session", {"session_id": sid})
            return out

    try:
        out = run_async(go)
        sdk_limits = [r.endpoint.manager.max_request_body_size for r in svc.app.routes
                      if getattr(r, "path", None) == "/mcp"]
    finally:
        svc.stop()
    _sb002(out["whole"], SMALL)
    assert out["sum"].structured_content["stdout"].split()[0] == hashlib.sha256(data).hexdigest()
    assert sdk_limits == [SMALL]  # the SDK's own check agrees


def test_the_write_file_description_says_how_to_send_more() -> None:
    from execbox.mcp.tools import BY_NAME

    text = BY_NAME["write_file"].description
    assert "mode 'append'" in text and "4 MiB" in text and "pieces" in text


@pytest.mark.parametrize("value", ["lots", "-1", "100", "4MiB"])
def test_a_bad_limit_stops_the_start(sci_jail, monkeypatch, value: str) -> None:
    monkeypatch.setenv(ENV, value)
    with pytest.raises(InvalidConfigError, match=ENV):
        start_service(sci_jail)


def test_a_body_declared_over_the_limit_and_stalled_is_answered_not_held(service) -> None:
    """The /mcp limit is the first reader of an MCP body: a client that declares more than the limit,
    sends a little and stalls gets the 413 once the bounded drain gives up (15 s), instead of being
    held for ever while the service's replica forwarding buffered the body (review 43, F3)."""
    import socket
    import time
    from urllib.parse import urlsplit

    u = urlsplit(service.url)
    head = (f"POST /mcp HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nAuthorization: Bearer {service.tenant_a}\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
            f"Content-Length: {DEFAULT + 1000}\r\n\r\n").encode()
    with socket.create_connection((u.hostname, u.port), timeout=40) as s:
        s.sendall(head + b"{" + b" " * 999)
        t0 = time.monotonic()
        reply = b""
        while b"\r\n\r\n" not in reply:
            got = s.recv(65536)
            if not got:
                break
            reply += got
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert time.monotonic() - t0 < 30
