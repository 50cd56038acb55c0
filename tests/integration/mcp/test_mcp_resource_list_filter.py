"""resources/list on a real `execbox serve` (jail boxes), review 43 F4: a FIFO, a unix socket and a
symlink whose text is not UTF-8 (leading out of the workspace) were listed, and every read of them
failed. Now only what a read can read is listed; a write to ``d/.`` or a move to ``m/`` (F5) is
SB002 and changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.mcp.conftest import http_client, run_async

pytestmark = pytest.mark.jail

SETUP = ("printf 'hello\\n' > README && ln -s README ok && mkfifo fifo && ln -s fifo tofifo && "
         "python3 -c \"import os, socket; os.symlink(b'/etc/host\\xffs', b'badlink'); "
         "s = socket.socket(socket.AF_UNIX); s.bind('sock')\" && ln -s badlink viabad && mkdir d && ls")


@pytest.fixture(scope="module")
def seen(service) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with http_client(service.url, service.tenant_a) as c:
            sid = (await c.call_tool("create_session", {})).structured_content["session"]["session_id"]
            made = await c.call_tool("run_command", {"session_id": sid, "command": SETUP})
            assert not made.is_error and "sock" in str(made.content), made
            listed = [r for r in (await c.list_resources()).resources if r.name.startswith(sid + "/")]
            out: dict[str, Any] = {"listed": sorted(r.name[len(sid) + 1:] for r in listed)}
            out["write"] = await c.call_tool("write_file", {"session_id": sid, "path": "d/.", "content": "x"})
            out["move"] = await c.call_tool("move_file", {"session_id": sid, "source": "README",
                                                          "destination": "m1/"})
            out["ls"] = await c.call_tool("run_command", {"session_id": sid, "command": "ls -p; ls d | wc -l"})
            await c.call_tool("close_session", {"session_id": sid})
            return out

    return run_async(go)


def test_only_regular_files_and_links_to_them_are_listed(seen) -> None:
    assert seen["listed"] == ["README", "ok"], seen["listed"]


def test_a_directory_form_is_refused_for_a_write_and_a_move(seen) -> None:
    for key, path in (("write", "'d/.'"), ("move", "'m1/'")):
        r = seen[key]
        assert r.is_error and "SB002" in str(r.content) and path in str(r.content), r
    text = str(seen["ls"].content)
    assert "m1" not in text and "README" in text and "d/" in text, text
