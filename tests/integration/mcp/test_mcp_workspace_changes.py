"""delete_file, create_directory and move_file through MCP on a real `execbox serve` (jail boxes):
the workspace changes as later reads and listings show, and paths leaving the workspace, the
workspace root and missing files or sessions are SB002 errors naming the argument."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.mcp.conftest import http_client, run_async

pytestmark = pytest.mark.jail


def _text(result: Any) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def _paths(listing: Any) -> set[str]:
    return {f["path"] for f in listing.structured_content["files"]}


def test_delete_mkdir_and_move_change_the_workspace(service) -> None:
    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_a) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]

            async def call(name: str, **args: Any) -> Any:
                return await c.call_tool(name, {"session_id": sid, **args})

            await call("write_file", path="src/notes.txt", content="moved text")
            await call("write_file", path="junk/a/b.txt", content="x")
            out = {"mkdir": await call("create_directory", path="build/out"),
                   "mkdir_again": await call("create_directory", path="build/out"),
                   "move": await call("move_file", source="src/notes.txt", destination="docs/notes.md"),
                   "read": await call("read_file", path="docs/notes.md"),
                   "old": await call("read_file", path="src/notes.txt"),
                   "delete": await call("delete_file", path="junk"),
                   "listing": await call("list_files", recursive=True),
                   "shell": await call("run_command", command="test -d build/out && test ! -e junk && echo ok")}
            await call("close_session")
            return out

    out = run_async(go)
    assert out["mkdir"].structured_content["created"] is True and "created directory build/out" in _text(out["mkdir"])
    assert out["mkdir_again"].structured_content["created"] is False and not out["mkdir_again"].is_error
    assert out["move"].structured_content["path"] == "docs/notes.md"
    assert out["read"].structured_content["content"] == "moved text"
    assert out["old"].is_error and out["old"].structured_content["error"]["code"] == "SB002"
    assert out["delete"].structured_content["deleted"] is True
    paths = _paths(out["listing"])
    assert {"build", "build/out", "docs", "docs/notes.md", "src"} <= paths
    assert not {p for p in paths if p.startswith("junk") or p == "src/notes.txt"}
    assert out["shell"].structured_content["stdout"] == "ok\n"


def test_bad_paths_and_sessions_are_sb002_naming_the_argument(service) -> None:
    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_b) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]

            async def call(name: str, **args: Any) -> Any:
                return await c.call_tool(name, {"session_id": sid, **args})

            await call("write_file", path="keep.txt", content="still here")
            await call("run_command", command="ln -s /etc outside")
            out = {"escape": await call("delete_file", path="../../etc/passwd"),
                   "absolute": await call("create_directory", path="/tmp/x"),
                   "dest": await call("move_file", source="keep.txt", destination="../keep.txt"),
                   "through_link": await call("delete_file", path="outside/passwd"),
                   "root": await call("delete_file", path="."),
                   "missing": await call("delete_file", path="nope.txt"),
                   "no_dest": await call("move_file", source="keep.txt"),
                   "session": await c.call_tool("create_directory", {"session_id": "no-such-session", "path": "d"}),
                   "kept": await call("read_file", path="keep.txt")}
            await call("close_session")
            return out

    out = run_async(go)
    expected = {"escape": "path", "absolute": "path", "dest": "destination", "through_link": "path",
                "root": "path", "no_dest": "destination"}
    for name, field in expected.items():
        result = out[name]
        assert result.is_error, (name, _text(result))
        err = result.structured_content["error"]
        assert err["code"] == "SB002" and err["details"].get("field") == field, (name, err)
        assert _text(result).startswith("error SB002: ")
    assert out["missing"].is_error and out["missing"].structured_content["error"]["code"] == "SB002"
    assert "no such file" in _text(out["missing"])
    err = out["session"].structured_content["error"]
    assert err["code"] == "SB002" and err["details"]["session_id"] == "no-such-session"
    assert out["kept"].structured_content["content"] == "still here"  # nothing refused touched it
