"""MCP's glob and grep tell the model what a capped or partial search left out (review 29, finding 2):
results truncated at max_results, binary files that match, files that could not be searched."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.mcp.conftest import http_client, run_async

pytestmark = pytest.mark.jail


def _text(result: Any) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def test_grep_and_glob_say_what_they_left_out(service) -> None:
    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_a) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            await c.call_tool("run_command", {"session_id": sid, "command": (
                "mkdir many && for i in $(seq 1 30); do echo hit $i > many/$i.txt; done && "
                "printf '\\0\\1 hit\\n' > blob.bin && mkfifo pipe && seq 1 2000000 > mid.log")})
            out = {"grep": await c.call_tool("grep", {"session_id": sid, "pattern": "^hit", "max_results": 5}),
                   "all": await c.call_tool("grep", {"session_id": sid, "pattern": "hit", "max_results": 100}),
                   "mid": await c.call_tool("grep", {"session_id": sid, "pattern": "^1234567$", "path": "mid.log"}),
                   "glob": await c.call_tool("glob", {"session_id": sid, "pattern": "many/*", "max_results": 4}),
                   "glob_all": await c.call_tool("glob", {"session_id": sid, "pattern": "many/*"}),
                   "bad": await c.call_tool("glob", {"session_id": sid, "pattern": "*", "max_results": 0})}
            await c.call_tool("close_session", {"session_id": sid})
            return out

    out = run_async(go)
    grep = out["grep"]
    assert not grep.is_error and grep.structured_content["truncated"] is True
    assert len(grep.structured_content["matches"]) == 5
    assert "[results truncated at 5; narrow the pattern or raise max_results]" in _text(grep)
    every = _text(out["all"])
    assert "Binary file blob.bin matches" in every
    assert "[skipped pipe: not a regular file (FIFO, socket or device)]" in every
    assert "truncated" not in every and out["all"].structured_content["binary_matches"] == ["blob.bin"]
    assert _text(out["mid"]) == "mid.log:1234567: 1234567"  # a 14.8 MB file is searched
    glob = out["glob"]
    assert glob.structured_content["truncated"] is True and len(glob.structured_content["paths"]) == 4
    assert _text(glob).endswith("[results truncated at 4; narrow the pattern or raise max_results]")
    assert out["glob_all"].structured_content["truncated"] is False and "truncated" not in _text(out["glob_all"])
    assert out["bad"].is_error and out["bad"].structured_content["error"]["details"]["field"] == "max_results"
