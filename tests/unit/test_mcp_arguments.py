"""MCP tool arguments are checked against each tool's published input schema before dispatch."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
import pytest

from execbox.errors import SandboxError
from execbox.mcp.arguments import check_arguments
from execbox.mcp.core import Caller
from execbox.mcp.server import build_server
from execbox.mcp.tools import BY_NAME, TOOLS

BAD = [  # (tool, arguments, the field the SB002 error must name, the schema keyword it broke)
    ("run_code", {}, "code", "required"),
    ("run_code", {"code": "print(1)", "timeout": "abc"}, "timeout", "type"),
    ("run_code", {"code": 5}, "code", "type"),
    ("run_code", {"code": "x", "session_id": 123}, "session_id", "type"),
    ("run_code", {"code": "x", "session_id": ["x"]}, "session_id", "type"),
    ("run_code", {"code": "x", "context_id": "c" * 5000}, "context_id", "maxLength"),
    ("run_code", {"code": "x", "context_id": "../other"}, "context_id", "pattern"),
    ("run_code", {"code": "x", "bogus": 1}, "bogus", "additionalProperties"),
    ("run_code", {"code": "x", "language": "cobol"}, "language", "enum"),
    ("run_code", {"code": "x", "arguments": [1, 2]}, "arguments", "type"),
    ("run_code", {"code": "x", "timeout": 0}, "timeout", "exclusiveMinimum"),
    ("run_code", {"code": "x", "timeout": True}, "timeout", "type"),
    ("close_session", {}, "session_id", "required"),
    ("create_session", {"session_id": "-leading-dash"}, "session_id", "pattern"),
    ("read_file", {"path": "f.txt", "offset": -5}, "offset", "minimum"),
    ("read_file", {"path": "f.txt", "limit": "x"}, "limit", "type"),
    ("write_file", {"path": "g.txt", "content": {"a": 1}}, "content", "type"),
    ("grep", {"pattern": "line", "max_results": 10**12}, "max_results", "maximum"),
    ("install_packages", {"pip": [{"a": 1}]}, "pip", "type"),
    ("list_sessions", {"tenant_id": "someone-else"}, "tenant_id", "additionalProperties"),
]


@pytest.mark.parametrize(("tool", "args", "field", "keyword"), BAD)
def test_bad_arguments_are_sb002_naming_the_field(tool: str, args: dict[str, Any], field: str, keyword: str) -> None:
    with pytest.raises(SandboxError) as caught:
        check_arguments(tool, BY_NAME[tool].input_schema, args)
    e = caught.value
    assert e.code == "SB002"
    assert e.details["field"] == field and e.details["constraint"] == keyword and e.details["tool"] == tool
    assert field in e.message
    assert len(e.message) < 300  # the offending value (5000 characters above) is never echoed


def test_valid_arguments_pass_unchanged() -> None:
    good = {"code": "def main(n):\n    return n", "language": "python", "session_id": "s-1", "context_id": "c",
            "timeout": 2.5, "arguments": {"n": 3}}
    assert check_arguments("run_code", BY_NAME["run_code"].input_schema, good) == good
    assert check_arguments("list_sessions", BY_NAME["list_sessions"].input_schema, None) == {}
    for tool in TOOLS:  # every required argument list names properties the schema defines
        assert set(tool.input_schema["required"]) <= set(tool.input_schema["properties"])


class _Core:
    """A core whose every attribute use fails the test: validation must refuse before dispatch."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the handler ran (core.{name}) for invalid arguments")


def test_server_refuses_before_the_handler_and_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    server = build_server(lambda ctx: (_Core(), Caller("t"), "k"))
    entry = server.get_request_handler("tools/call")
    assert entry is not None

    async def go() -> list[types.CallToolResult]:
        return [await entry.handler(None, types.CallToolRequestParams(name=name, arguments=args)) for name, args in
                (("run_code", {}), ("close_session", {}), ("run_code", {"code": "x", "timeout": "abc"}),
                 ("run_code", {"code": "x", "session_id": 123}))]

    with caplog.at_level("DEBUG", logger="execbox.mcp"):
        results = anyio.run(go)
    for r in results:
        assert r.is_error
        err = r.structured_content["error"]
        assert err["code"] == "SB002"
        assert "internal" not in r.content[0].text and "Traceback" not in r.content[0].text
    assert [r.structured_content["error"]["details"]["field"] for r in results] == \
        ["code", "session_id", "timeout", "session_id"]
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
