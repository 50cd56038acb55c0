"""MCP transport sessions over streamable HTTP are bounded (review 31, F5), on a real `execbox serve`:

- one token holds at most EXECBOX_MCP_MAX_SESSIONS MCP sessions at once (2000 initializes used to
  take 2000 sessions, each living SANDBOX_IDLE_TIMEOUT): the next initialize is HTTP 429 with an
  SB008 body and a Retry-After, also when many arrive at once; other tokens are not affected, the
  sessionless protocol still works, and ending a session frees its place;
- a session that never made a tool call ends after EXECBOX_MCP_UNUSED_SESSION_TIMEOUT, while one
  that did lives on.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from execbox.errors import InvalidConfigError
from tests.integration.mcp.conftest import http_client, run_async
from tests.integration.mcp.test_mcp_session_binding import VERSION, RawMcp
from tests.integration.service.conftest import start_service

pytestmark = pytest.mark.jail


def _initialize(url: str, token: str) -> httpx.Response:
    return httpx.post(url + "/mcp", timeout=60, headers={
        "Accept": "application/json, text/event-stream", "Content-Type": "application/json",
        "Authorization": f"Bearer {token}", "MCP-Protocol-Version": VERSION},
        json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})


def test_a_token_holds_at_most_its_cap_of_mcp_sessions(sci_jail, monkeypatch) -> None:
    monkeypatch.setenv("EXECBOX_MCP_MAX_SESSIONS", "3")
    svc = start_service(sci_jail)
    try:
        alice = [RawMcp(svc.url, svc.tenant_a) for _ in range(3)]
        for client in alice:
            client.initialize()
        refused = _initialize(svc.url, svc.tenant_a)
        assert refused.status_code == 429, refused.text
        err = refused.json()["error"]
        assert err["code"] == "SB008" and err["details"]["limit"] == 3 and "EXECBOX_MCP_MAX_SESSIONS" in err["message"]
        assert 1 <= int(refused.headers["retry-after"]) <= 300  # when the first unused one expires

        assert _initialize(svc.url, svc.tenant_b).status_code == 200  # another tenant's token
        _, second = svc.store.tokens.create("tenant-a")
        assert _initialize(svc.url, second).status_code == 200  # the cap is per token

        async def sessionless() -> Any:  # the 2026-07-28 protocol opens no MCP session: never refused
            async with http_client(svc.url, svc.tenant_a) as c:
                return await c.call_tool("list_sessions", {})
        assert not run_async(sessionless).is_error

        status, body = alice[0].tool("run_code", {"code": "print(6 * 7)"})  # the open ones still work
        assert status == 200 and body["result"]["structuredContent"]["stdout"] == "42\n"
        assert alice[1].delete().status_code == 200  # ending one frees its place
        assert _initialize(svc.url, svc.tenant_a).status_code == 200
        assert _initialize(svc.url, svc.tenant_a).status_code == 429

        _, burst_token = svc.store.tokens.create("tenant-b")  # many at once: exactly the cap get in
        codes: list[int] = []
        threads = [threading.Thread(target=lambda: codes.append(_initialize(svc.url, burst_token).status_code))
                   for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(codes) == [200] * 3 + [429] * 9, codes
    finally:
        svc.stop()


def test_an_mcp_session_without_a_tool_call_expires_sooner(sci_jail, monkeypatch) -> None:
    monkeypatch.setenv("EXECBOX_MCP_UNUSED_SESSION_TIMEOUT", "1s")  # SANDBOX_IDLE_TIMEOUT stays 900 s
    svc = start_service(sci_jail)
    try:
        unused, used = RawMcp(svc.url, svc.tenant_a), RawMcp(svc.url, svc.tenant_a)
        unused.initialize()
        used.initialize()
        assert used.tool("list_sessions", {})[0] == 200
        time.sleep(2.5)  # no request in between: any request restarts the countdown
        gone = unused.post({"jsonrpc": "2.0", "id": 9, "method": "tools/list"})
        assert gone.status_code == 404, "an MCP session that never made a tool call did not expire"
        status, body = used.tool("run_code", {"code": "print('still here')"})
        assert status == 200 and body["result"]["structuredContent"]["stdout"] == "still here\n"
    finally:
        svc.stop()


@pytest.mark.parametrize(("name", "value"), [("EXECBOX_MCP_MAX_SESSIONS", "lots"),
                                             ("EXECBOX_MCP_MAX_SESSIONS", "-1"),
                                             ("EXECBOX_MCP_UNUSED_SESSION_TIMEOUT", "soon")])
def test_a_bad_setting_stops_the_start(sci_jail, monkeypatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidConfigError, match=name):
        start_service(sci_jail)
