"""MCP accepts exactly the session ids the HTTP API accepts (review 31, F7): a session the HTTP API
made as `_x` is reachable from MCP (its pattern refused a leading `_`), and what the HTTP API
refuses MCP refuses too (SB002 naming `session_id`)."""

from __future__ import annotations

from typing import Any

import pytest

from execbox.mcp.tools import BY_NAME
from execbox.service.sessions import NAME_PATTERN
from tests.integration.mcp.conftest import http_client, run_async

pytestmark = pytest.mark.jail


def test_the_session_id_schema_is_the_http_apis() -> None:
    for tool in BY_NAME.values():
        prop = tool.input_schema["properties"].get("session_id")
        if prop is not None:
            assert prop["pattern"] == NAME_PATTERN and prop["maxLength"] == 64, tool.name


def test_a_session_the_http_api_accepts_is_reachable_from_mcp(service) -> None:
    http = service.a
    for sid in ("_x", "__", "_a.b-c"):
        r = http.post("/v1/sandbox/write", json={"session_id": sid, "path": "hello.txt", "content": f"from {sid}\n"})
        assert r.status_code == 200, r.text
    bad = {sid: http.post("/v1/sandbox/write", json={"session_id": sid, "path": "a", "content": ""}).status_code
           for sid in ("-x", ".x", "x" * 65, "a/b")}
    assert set(bad.values()) == {400}, bad

    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_a) as c:
            out: dict[str, Any] = {sid: await c.call_tool("read_file", {"session_id": sid, "path": "hello.txt"})
                                   for sid in ("_x", "__", "_a.b-c")}
            out["run"] = await c.call_tool("run_command", {"session_id": "_x", "command": "cat hello.txt"})
            for sid in bad:
                out[sid] = await c.call_tool("read_file", {"session_id": sid, "path": "a"})
            out["close"] = await c.call_tool("close_session", {"session_id": "_x"})
            return out

    out = run_async(go)
    for sid in ("_x", "__", "_a.b-c"):
        assert not out[sid].is_error and out[sid].structured_content["content"] == f"from {sid}\n", out[sid]
    assert out["run"].structured_content["stdout"] == "from _x\n"
    assert not out["close"].is_error
    for sid in bad:
        err = out[sid].structured_content["error"]
        assert out[sid].is_error and err["code"] == "SB002" and err["details"]["field"] == "session_id", sid
