"""Resources on a real `execbox serve` (jail boxes), review 42 findings 3, 7 and 8:

- a file reads as text by read_file's test (no NUL in its first 8 KiB) and UTF-8, whatever its name:
  a ``README`` of plain text was a base64 blob because its name has no MIME type; a ``.txt`` holding
  a NUL or Latin-1 bytes is a blob;
- ``resources/list`` leaves out symlinks that lead outside the workspace (or to a directory, or to
  nothing), which every read refused, and lists those that lead to a file inside;
- a URI that is not an execbox resource is an SB002 error like every other resource error.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests.integration.mcp.conftest import http_client, run_async

pytestmark = pytest.mark.jail

FILES = {"README": b"plain text\n", "notes.md": b"# notes\n", "nul.txt": b"a\x00b\n",
         "latin.txt": "caf\u00e9\n".encode("latin-1"), "sub/f.txt": b"inside\n"}
LINKS = "ln -s README ok && ln -s /etc/passwd pw && ln -s .. up && ln -s nothing dangling && ln -s sub dirlink " \
        "&& ln -s dirlink/f.txt via && ln -s ../../x sub/out && ln -s loop2 loop1 && ln -s loop1 loop2"


async def _read(c: Any, uri: str) -> Any:
    from mcp.shared.exceptions import MCPError

    try:
        return await c.read_resource(uri)
    except MCPError as e:
        return e


@pytest.fixture(scope="module")
def seen(service) -> dict[str, Any]:
    """A session with FILES and LINKS: what resources/list offers, a read of each, two bad URIs."""
    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_a) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            for path, data in FILES.items():
                r = await c.call_tool("write_file", {"session_id": sid, "path": path, "encoding": "base64",
                                                     "content": base64.b64encode(data).decode()})
                assert not r.is_error, r
            made = await c.call_tool("run_command", {"session_id": sid, "command": LINKS})
            assert not made.is_error, made
            uri = f"execbox://sessions/{sid}/files/"
            listed = [r for r in (await c.list_resources()).resources if r.name.startswith(sid + "/")]
            out: dict[str, Any] = {"sid": sid, "listed": {r.name[len(sid) + 1:]: r.size for r in listed}}
            out["reads"] = {name: await _read(c, uri + name) for name in [*FILES, "ok", "via"]}
            out["bad"] = [await _read(c, u) for u in (f"execbox://sessions/{sid}/files/", "file:///etc/passwd")]
            await c.call_tool("close_session", {"session_id": sid})
            return out

    return run_async(go)


def test_a_file_is_text_by_its_content_not_its_name(seen) -> None:
    reads = seen["reads"]
    for name, r in reads.items():
        assert type(r).__name__ == "ReadResourceResult", (name, r)
    kinds = {name: (type(r.contents[0]).__name__, r.contents[0].mime_type) for name, r in reads.items()}
    assert kinds["README"] == ("TextResourceContents", "text/plain")
    assert reads["README"].contents[0].text == "plain text\n"
    assert kinds["ok"] == ("TextResourceContents", "text/plain")  # the link reads as its target does
    assert kinds["notes.md"] == ("TextResourceContents", "text/markdown")
    assert kinds["nul.txt"] == ("BlobResourceContents", "text/plain")  # read_file calls it binary
    assert kinds["latin.txt"] == ("BlobResourceContents", "text/plain")  # not UTF-8: the bytes, unchanged
    assert base64.b64decode(reads["latin.txt"].contents[0].blob) == FILES["latin.txt"]


def test_only_links_a_read_can_follow_are_listed(seen) -> None:
    assert seen["listed"] == {"README": 11, "notes.md": 8, "nul.txt": 4, "latin.txt": 5, "sub/f.txt": 7,
                              "ok": 11, "via": 7}, seen["listed"]


def test_a_uri_that_is_not_a_resource_is_sb002(seen) -> None:
    for err in seen["bad"]:
        assert type(err).__name__ == "MCPError", err
        assert err.error.message.startswith("SB002: not an execbox resource: "), err.error.message
        assert err.error.data["code"] == "SB002"
