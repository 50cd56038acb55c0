"""The background-process, interrupt and workspace-change tools over stdio (`execbox mcp`, spawned by
the mcp SDK's stdio client, jail provider): the in-process server has its own process table."""

from __future__ import annotations

import json
import os
from typing import Any

import anyio
import pytest

from tests.conftest import require
from tests.integration.mcp.conftest import run_async
from tests.integration.mcp.test_mcp_stdio import _execbox

pytestmark = pytest.mark.jail


def test_stdio_serves_processes_interrupt_and_workspace_changes(tmp_path) -> None:
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
        args=["mcp", "--provider", "jail", "--tenant", "me", "--workspaces", str(workspaces),
              "--config", json.dumps({"preload": "none", "pool_size": 0})])

    async def go() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Client(params) as c:
            out["tools"] = {t.name for t in (await c.list_tools()).tools}
            out["none"] = await c.call_tool("list_processes", {})  # no session yet: none started for it
            out["no_session"] = await c.call_tool("list_sessions", {})
            start = out["start"] = await c.call_tool("start_process", {
                "command": "echo up; while true; do sleep 0.1; done", "wait": 10})
            pid = start.structured_content["pid"]
            out["listed"] = await c.call_tool("list_processes", {})
            out["kill"] = await c.call_tool("kill_process", {"pid": pid, "signal": "SIGKILL"})
            await c.call_tool("run_code", {"code": "n = 5"})

            async def spin() -> None:
                out["spin"] = await c.call_tool("run_code", {"code": "while True:\n    pass", "timeout": 120})

            async with anyio.create_task_group() as tg:
                tg.start_soon(spin)
                await anyio.sleep(1.5)
                out["interrupt"] = await c.call_tool("interrupt_run", {})
            out["after"] = await c.call_tool("run_code", {"code": "print(n * 2)"})
            await c.call_tool("create_directory", {"path": "a/b"})
            await c.call_tool("write_file", {"path": "a/b/f.txt", "content": "f"})
            out["move"] = await c.call_tool("move_file", {"source": "a/b/f.txt", "destination": "g.txt"})
            out["delete"] = await c.call_tool("delete_file", {"path": "a"})
            out["listing"] = await c.call_tool("list_files", {"recursive": True})
        return out

    out = run_async(go)
    assert {"start_process", "list_processes", "read_process_output", "write_process_input", "kill_process",
            "interrupt_run", "delete_file", "create_directory", "move_file"} <= out["tools"]
    assert out["none"].structured_content["processes"] == []
    assert out["no_session"].structured_content["sessions"] == []  # looking did not start a box
    assert out["start"].structured_content["stdout"] == "up\n" and out["start"].structured_content["running"]
    assert [p["status"] for p in out["listed"].structured_content["processes"]] == ["running"]
    kill = out["kill"].structured_content
    assert kill["running"] is False and kill["signal"] == 9 and kill["status"] == "signalled"
    assert out["interrupt"].structured_content["interrupted"] is True
    assert out["spin"].structured_content["interrupted"] is True
    assert out["after"].structured_content["stdout"] == "10\n"
    assert out["move"].structured_content["path"] == "g.txt" and not out["delete"].is_error
    assert {f["path"] for f in out["listing"].structured_content["files"]} - {"artifacts"} == {"g.txt"}
