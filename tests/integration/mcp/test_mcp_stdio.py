"""`execbox mcp` over stdio, spawned by the mcp SDK's own stdio client, on the jail provider."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

from tests.conftest import require
from tests.integration.mcp.conftest import run_async

pytestmark = pytest.mark.jail


def _execbox() -> str:
    path = os.path.join(os.path.dirname(sys.executable), "execbox")
    require(os.path.exists(path), "the execbox console script in this venv (make install)")
    return path


def test_stdio_server_runs_tools_keeps_state_and_refuses_traversal(tmp_path) -> None:
    from execbox.providers.jail import JailProvider

    ok, reason = JailProvider.availability()
    require(ok, f"bubblewrap jail ({reason})")
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    workspaces = tmp_path / "ws"
    workspaces.mkdir()
    os.chmod(tmp_path, 0o711)
    params = StdioServerParameters(
        command=_execbox(),
        args=["mcp", "--provider", "jail", "--tenant", "me", "--max-timeout", "2s",
              "--workspaces", str(workspaces), "--config", json.dumps({"preload": "none", "pool_size": 0})])

    async def go() -> dict[str, Any]:
        async with Client(params) as c:
            out: dict[str, Any] = {"tools": {t.name for t in (await c.list_tools()).tools}}
            out["set"] = await c.call_tool("run_code", {"code": "counter = 10"})
            out["get"] = await c.call_tool("run_code", {"code": "counter += 1\nprint(counter)"})
            out["bash"] = await c.call_tool("run_command", {"command": "id -u; pwd"})
            out["write"] = await c.call_tool("write_file", {"path": "x/y.txt", "content": "payload"})
            out["read"] = await c.call_tool("read_file", {"path": "x/y.txt"})
            out["escape"] = await c.call_tool("read_file", {"path": "../../../etc/passwd"})
            out["slow"] = await c.call_tool("run_code", {"code": "import time\ntime.sleep(30)", "timeout": 60})
            out["sessions"] = await c.call_tool("list_sessions", {})
            return out

    out = run_async(go)
    assert "run_code" in out["tools"] and "grep" in out["tools"]
    assert out["get"].structured_content["stdout"] == "11\n"
    assert out["bash"].structured_content["stdout"].split() == ["1000", "/workspace"]
    assert out["read"].structured_content["content"] == "payload"
    assert out["escape"].is_error and out["escape"].structured_content["error"]["code"] == "SB002"
    # --max-timeout 2s caps the asked 60 s: the run is killed as SB005 and the cap is reported
    slow = out["slow"]
    assert slow.is_error and slow.structured_content["metadata"]["error_code"] == "SB005"
    assert slow.structured_content["notes"] == ["timeout capped to 2 s"]
    assert [s["tenant_id"] for s in out["sessions"].structured_content["sessions"]] == ["me"]
    # the client disconnected: the process closed its session and deleted the workspace
    tenant_dir = workspaces / "me"
    leftover = list(tenant_dir.iterdir()) if tenant_dir.exists() else []
    assert leftover == []
