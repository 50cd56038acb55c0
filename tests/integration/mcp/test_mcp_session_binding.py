"""An Mcp-Session-Id belongs to the token whose initialize opened it: any other token (another
tenant's, or another token of the same tenant) gets 404 as for an unknown session, on POST, GET
and DELETE, and cannot end the owner's MCP session or its execbox session."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.jail

VERSION = "2025-11-25"


class RawMcp:
    """A handshake-era streamable HTTP client speaking raw JSON-RPC, so a test can present any
    Mcp-Session-Id with any token."""

    def __init__(self, url: str, token: str, session: str | None = None) -> None:
        self.url, self.token, self.session, self.n = url + "/mcp", token, session, 0
        self.http = httpx.Client(timeout=60)

    def headers(self) -> dict[str, str]:
        h = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
             "Authorization": f"Bearer {self.token}", "MCP-Protocol-Version": VERSION}
        if self.session:
            h["Mcp-Session-Id"] = self.session
        return h

    def initialize(self) -> str:
        r = self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        assert r.status_code == 200, r.text
        self.session = r.headers["mcp-session-id"]
        assert self.post({"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202
        return self.session

    def post(self, body: dict[str, Any]) -> httpx.Response:
        return self.http.post(self.url, headers=self.headers(), content=json.dumps(body))

    def tool(self, name: str, arguments: dict[str, Any]) -> tuple[int, Any]:
        self.n += 1
        r = self.post({"jsonrpc": "2.0", "id": self.n, "method": "tools/call",
                       "params": {"name": name, "arguments": arguments}})
        return r.status_code, _body(r)

    def get(self) -> httpx.Response:
        h = {**self.headers(), "Accept": "text/event-stream"}
        with self.http.stream("GET", self.url, headers=h) as r:
            if r.status_code == 200:  # the owner's standalone stream: do not wait on it
                return r
            r.read()
            return r

    def delete(self) -> httpx.Response:
        return self.http.delete(self.url, headers=self.headers())


def _body(r: httpx.Response) -> Any:
    if "text/event-stream" in r.headers.get("content-type", ""):
        data = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
        return json.loads([d for d in data if d][-1])
    return r.json()


def _not_found(r: httpx.Response | tuple[int, Any]) -> bool:
    status, body = (r.status_code, r.json()) if isinstance(r, httpx.Response) else r
    return status == 404 and body["error"]["message"] == "Session not found"


def test_another_token_cannot_use_or_end_an_mcp_session(service) -> None:
    sessions = service.app.state.services.sessions
    _, a_second = service.store.tokens.create("tenant-a")  # same tenant, another token
    alice = RawMcp(service.url, service.tenant_a)
    mcp_session = alice.initialize()
    status, body = alice.tool("run_code", {"code": "secret = 'alice'\nprint(secret)"})
    assert status == 200 and body["result"]["structuredContent"]["stdout"] == "alice\n"
    sid = body["result"]["structuredContent"]["session_id"]

    unknown = RawMcp(service.url, service.tenant_a, "0" * 32).tool("list_sessions", {})
    for token in (service.tenant_b, a_second):
        other = RawMcp(service.url, token, mcp_session)
        assert _not_found(unknown)
        assert _not_found(other.tool("run_code", {"code": "print(secret)"}))  # exactly as for an unknown id
        assert _not_found(other.get())
        assert _not_found(other.delete())
        assert sessions.get("tenant-a", sid) is not None  # alice's execbox session survived the DELETE

    status, body = alice.tool("run_code", {"code": "print(secret)"})  # alice's MCP session is intact
    assert status == 200 and body["result"]["structuredContent"]["stdout"] == "alice\n"
    assert body["result"]["structuredContent"]["session_id"] == sid
    assert alice.delete().status_code == 200  # the owner ends it: its execbox session closes
    assert sessions.get("tenant-a", sid) is None
    assert _not_found(alice.tool("list_sessions", {}))
