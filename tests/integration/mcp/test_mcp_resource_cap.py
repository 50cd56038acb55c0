"""``resources/read`` is bounded like every tool reply, on a real `execbox serve` (jail boxes):

- a file larger than EXECBOX_MCP_MAX_RESOURCE_BYTES (4 MiB by default) is refused with a JSON-RPC
  error naming its size, the limit and how to read it instead (read_file for text; split in the box
  for binary), never cut short; it used to come back whole, up to 64 MiB (base64 for binary), in one
  reply, and a file over 64 MiB was refused with advice (offset, length) that MCP cannot follow;
- the service reads at most the limit to decide, never the whole file;
- files within the limit, text and binary, still come back whole, one of exactly the limit included;
- following the refusal's advice reads the file back exactly;
- a run's artifact larger than the limit is described with how to read it, not linked.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
from typing import Any

import pytest

from execbox.errors import InvalidConfigError
from tests.integration.mcp.conftest import http_client, run_async
from tests.integration.service.conftest import start_service

pytestmark = pytest.mark.jail

MIB = 1024 * 1024
DEFAULT = 4 * MIB


def _spy(monkeypatch: pytest.MonkeyPatch, provider: Any) -> list[tuple[Any, int]]:
    """Every read_bytes the service makes of the provider: (length asked, bytes returned)."""
    reads: list[tuple[Any, int]] = []
    real = provider.read_bytes

    def read_bytes(instance_id: str, path: str, offset: int | None = None, length: int | None = None) -> bytes:
        data = real(instance_id, path, offset=offset, length=length)
        reads.append((length, len(data)))
        return data

    monkeypatch.setattr(provider, "read_bytes", read_bytes)
    return reads


async def _refused(c: Any, uri: str) -> Any:
    from mcp.shared.exceptions import MCPError

    try:
        r = await c.read_resource(uri)
    except MCPError as e:
        return e
    return r


def test_a_file_over_the_limit_is_refused_naming_size_limit_and_the_tool_to_use(service, sci_jail,
                                                                                 monkeypatch) -> None:
    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_a) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            await c.call_tool("write_file", {"session_id": sid, "path": "notes.txt", "content": "alpha\nbeta\n"})
            await c.call_tool("write_file", {"session_id": sid, "path": "b.bin", "encoding": "base64",
                                             "content": base64.b64encode(bytes(range(256))).decode()})
            made = await c.call_tool("run_command", {"session_id": sid, "command": (
                f"head -c {DEFAULT} /dev/zero | tr '\\0' a > exact.txt && "
                f"yes 'a line of the log' | head -c {5 * MIB} > big.log && "
                "truncate -s 64M huge.bin && truncate -s 100M huger.bin")})
            assert not made.is_error, made
            uri = f"execbox://sessions/{sid}/files/"
            reads.clear()
            out: dict[str, Any] = {"sid": sid}
            for name in ("notes.txt", "b.bin", "exact.txt", "big.log", "huge.bin", "huger.bin"):
                out[name] = await _refused(c, uri + name)
            await c.call_tool("close_session", {"session_id": sid})
            return out

    reads = _spy(monkeypatch, sci_jail)
    out = run_async(go)
    sid = out["sid"]
    assert out["notes.txt"].contents[0].text == "alpha\nbeta\n"
    assert base64.b64decode(out["b.bin"].contents[0].blob) == bytes(range(256))
    assert out["exact.txt"].contents[0].text == "a" * DEFAULT  # exactly the limit: whole
    for name, size, tool in (("big.log", 5 * MIB, "read_file"), ("huge.bin", 64 * MIB, "run_command"),
                             ("huger.bin", 100 * MIB, "run_command")):
        err = out[name]
        assert not hasattr(err, "contents"), f"{name} was sent"
        assert err.error.code == -32602, err
        msg = err.error.message
        assert f"{size} bytes" in msg and f"{DEFAULT}-byte limit" in msg, msg
        assert "EXECBOX_MCP_MAX_RESOURCE_BYTES" in msg and f"the {tool} tool" in msg, msg
        assert err.error.data == {"code": "SB002", "reason": "resource_too_large", "path": name, "size": size,
                                  "limit": DEFAULT, "session_id": sid, "tool": tool,
                                  "setting": "EXECBOX_MCP_MAX_RESOURCE_BYTES",
                                  "uri": f"execbox://sessions/{sid}/files/{name}"}
    assert "offset=0" in out["big.log"].error.message and "split -b" in out["huge.bin"].error.message
    # never more than the limit read to decide (it was the whole file: 5 and 64 MiB)
    assert reads and all(length is not None and length <= DEFAULT for length, _ in reads), reads
    assert max(n for _, n in reads) == DEFAULT, reads


def test_the_advice_reads_the_file_back_and_big_artifacts_are_described(sci_jail, monkeypatch) -> None:
    monkeypatch.setenv("EXECBOX_MCP_MAX_RESOURCE_BYTES", "4096")
    svc = start_service(sci_jail)
    data = os.urandom(10000)
    text = "".join(f"line {i}\n" for i in range(1000))  # 8890 bytes

    async def go() -> dict[str, Any]:
        async with http_client(svc.url, svc.tenant_a) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            await c.call_tool("write_file", {"session_id": sid, "path": "d/blob.bin", "encoding": "base64",
                                             "content": base64.b64encode(data).decode()})
            await c.call_tool("write_file", {"session_id": sid, "path": "d/log.txt", "content": text})
            uri = f"execbox://sessions/{sid}/files/"
            out: dict[str, Any] = {"sid": sid, "blob": await _refused(c, uri + "d/blob.bin"),
                                   "log": await _refused(c, uri + "d/log.txt")}
            command = re.search(r"`(split [^`]+)`", out["blob"].error.message).group(1)
            out["split"] = await c.call_tool("run_command", {"session_id": sid, "command": command})
            listed = await c.call_tool("glob", {"session_id": sid, "pattern": "d/blob.bin.part-*"})
            out["parts"] = [await c.read_resource(uri + p) for p in sorted(listed.structured_content["paths"])]
            out["page"] = await c.call_tool("read_file", {"session_id": sid, "path": "d/log.txt", "offset": 0})
            out["run"] = await c.call_tool("run_code", {"session_id": sid, "code": (
                "import os\nos.makedirs('artifacts', exist_ok=True)\n"
                "open('artifacts/big.bin', 'wb').write(os.urandom(5000))\n"
                "open('artifacts/small.txt', 'w').write('tiny')\n")})
            links = [b for b in out["run"].content if b.type == "resource_link"]
            out["small"] = [await c.read_resource(str(b.uri)) for b in links]
            await c.call_tool("close_session", {"session_id": sid})
            return out

    try:
        out = run_async(go)
    finally:
        svc.stop()
    assert out["blob"].error.data["size"] == 10000 and out["blob"].error.data["limit"] == 4096
    assert out["log"].error.data["size"] == len(text) and out["log"].error.data["tool"] == "read_file"
    assert not out["split"].is_error, out["split"]
    assert len(out["parts"]) == 3
    assert b"".join(base64.b64decode(p.contents[0].blob) for p in out["parts"]) == data
    assert out["page"].structured_content["content"] == text
    texts = [b.text for b in out["run"].content if b.type == "text"]
    big = [t for t in texts if t.startswith("artifact big.bin")]
    assert big and "5000 bytes" in big[0] and "4096-byte limit" in big[0] and "split -b 4096" in big[0], texts
    assert [r.contents[0].text for r in out["small"]] == ["tiny"]  # a small artifact is still a readable link
    assert not any("big.bin" in str(getattr(b, "uri", "")) for b in out["run"].content)


@pytest.mark.parametrize("value", ["lots", "-1", "4MiB", str(64 * MIB + 1)])
def test_a_bad_limit_stops_the_start(sci_jail, monkeypatch, value: str) -> None:
    monkeypatch.setenv("EXECBOX_MCP_MAX_RESOURCE_BYTES", value)
    with pytest.raises(InvalidConfigError, match="EXECBOX_MCP_MAX_RESOURCE_BYTES"):
        start_service(sci_jail)


def _execbox() -> str:
    from tests.conftest import require

    path = os.path.join(os.path.dirname(__import__("sys").executable), "execbox")
    require(os.path.exists(path), "the execbox console script in this venv (make install)")
    return path


def test_stdio_reads_the_limit_and_refuses_a_bad_one(tmp_path) -> None:
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    workspaces = tmp_path / "ws"
    workspaces.mkdir()
    os.chmod(tmp_path, 0o711)
    args = ["mcp", "--provider", "jail", "--workspaces", str(workspaces), "--config", '{"preload": "none"}']
    bad = subprocess.run([_execbox(), *args], env={**os.environ, "EXECBOX_MCP_MAX_RESOURCE_BYTES": "lots"},
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "EXECBOX_MCP_MAX_RESOURCE_BYTES" in bad.stderr, bad
    params = StdioServerParameters(command=_execbox(), args=args,
                                   env={**os.environ, "EXECBOX_MCP_MAX_RESOURCE_BYTES": "100"})

    async def go() -> dict[str, Any]:
        async with Client(params) as c:
            w = await c.call_tool("write_file", {"path": "a.txt", "content": "x" * 100})
            await c.call_tool("write_file", {"path": "b.txt", "content": "x" * 101})
            uri = f"execbox://sessions/{w.structured_content['session_id']}/files/"
            return {"a": await c.read_resource(uri + "a.txt"), "b": await _refused(c, uri + "b.txt")}

    out = run_async(go)
    assert out["a"].contents[0].text == "x" * 100
    assert out["b"].error.data["size"] == 101 and out["b"].error.data["limit"] == 100
    assert "101 bytes" in out["b"].error.message and "read_file" in out["b"].error.message

