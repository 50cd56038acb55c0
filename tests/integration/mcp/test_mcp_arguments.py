"""Tool arguments outside a tool's published input schema are SB002 tool errors naming the field,
over streamable HTTP and over stdio, never an internal error, and never reach a handler or the audit log."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import pytest

from tests.conftest import require
from tests.integration.mcp.conftest import http_client, run_async

pytestmark = pytest.mark.jail

CASES = [  # (tool, arguments, the field the error names)
    ("run_code", {}, "code"),
    ("close_session", {}, "session_id"),
    ("run_code", {"code": "print(1)", "timeout": "abc"}, "timeout"),
    ("run_code", {"code": 5}, "code"),
    ("run_code", {"code": "print(1)", "session_id": 123}, "session_id"),
    ("run_code", {"code": "print(1)", "session_id": ["x"]}, "session_id"),
    ("run_code", {"code": "print(1)", "context_id": "x" * 5000}, "context_id"),
    ("run_code", {"code": "print(1)", "bogus": 1}, "bogus"),
    ("write_file", {"path": "g.txt", "content": "x", "mode": "create"}, "mode"),
    ("grep", {"pattern": "x", "max_results": -1}, "max_results"),
]


def _check(results: list[Any]) -> None:
    for (tool, args, field), r in zip(CASES, results, strict=True):
        assert r.is_error, (tool, args)
        err = r.structured_content["error"]
        assert err["code"] == "SB002", (tool, args, err)
        assert err["details"]["field"] == field, (tool, args, err)
        text = "\n".join(c.text for c in r.content if c.type == "text")
        assert "SB002" in text and "internal" not in text and "xxxxxxxxxx" not in text


def test_http_tool_arguments_are_validated_against_the_schema(service, caplog) -> None:
    svc = service.app.state.services

    async def go() -> list[Any]:
        async with http_client(service.url, service.tenant_a) as c:
            out = [await c.call_tool(tool, args) for tool, args, _ in CASES]
            out.append(await c.call_tool("run_code", {"code": "print(6 * 7)"}))  # still serving
            return out

    with caplog.at_level(logging.ERROR, logger="execbox"):
        *results, ok = run_async(go)
    _check(results)
    assert not ok.is_error and ok.structured_content["stdout"] == "42\n"
    assert not [r for r in caplog.records if r.name.startswith("execbox") and r.levelno >= logging.ERROR]
    svc.audit.flush()
    rows = svc.store.audit.list(tenant_id="tenant-a")
    assert all(r["session_id"] is None or isinstance(r["session_id"], str) for r in rows)
    assert not [r for r in rows if r["session_id"] in ("123", "['x']")]  # refused before the run path


def test_stdio_tool_arguments_are_validated_against_the_schema(tmp_path) -> None:
    from execbox.providers.jail import JailProvider

    ok, reason = JailProvider.availability()
    require(ok, f"bubblewrap jail ({reason})")
    exe = os.path.join(os.path.dirname(sys.executable), "execbox")
    require(os.path.exists(exe), "the execbox console script in this venv (make install)")
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    workspaces = tmp_path / "ws"
    workspaces.mkdir()
    os.chmod(tmp_path, 0o711)
    params = StdioServerParameters(
        command=exe, args=["mcp", "--provider", "jail", "--tenant", "me", "--workspaces", str(workspaces),
                           "--config", json.dumps({"preload": "none", "pool_size": 0})])

    async def go() -> list[Any]:
        async with Client(params) as c:
            out = [await c.call_tool(tool, args) for tool, args, _ in CASES]
            out.append(await c.call_tool("run_code", {"code": "print('still alive')"}))
            return out

    *results, alive = run_async(go)
    _check(results)
    assert alive.structured_content["stdout"] == "still alive\n"
