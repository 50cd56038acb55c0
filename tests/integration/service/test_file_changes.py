"""Delete, make a directory and move over HTTP and the remote SDKs, on a real service (jail
boxes): the operations an agent needed the E2B facade for (review 29, finding 6)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from execbox import AsyncRemoteSandbox, RemoteSandbox

from .conftest import Service, error_of

pytestmark = pytest.mark.jail


def _bash(c: Any, session: str, command: str) -> str:
    r = c.post("/v1/sandbox/bash", json={"session_id": session, "command": command, "timeout": 60})
    assert r.status_code == 200, r.text
    return r.json()["stdout"]


def test_mkdir_move_and_delete_change_the_workspace(service: Service) -> None:
    c, s = service.a, {"session_id": "fc"}
    r = c.post("/v1/sandbox/mkdir", json={**s, "path": "a/b/c"})
    assert (r.status_code, r.json()) == (200, {"path": "a/b/c", "created": True}), r.text
    assert c.post("/v1/sandbox/mkdir", json={**s, "path": "a/b"}).json()["created"] is False
    c.post("/v1/sandbox/write", json={**s, "path": "a/b/c/f.txt", "content": "data"}).raise_for_status()
    r = c.post("/v1/sandbox/move", json={**s, "source": "a/b/c/f.txt", "destination": "top/g.txt"})
    assert (r.status_code, r.json()) == (200, {"source": "a/b/c/f.txt", "path": "top/g.txt"}), r.text
    assert _bash(c, "fc", "cat top/g.txt; test -e a/b/c/f.txt || echo gone") == "datagone\n"
    r = c.post("/v1/sandbox/delete", json={**s, "path": "a"})  # a directory with what it holds
    assert (r.status_code, r.json()) == (200, {"path": "a", "deleted": True}), r.text
    assert _bash(c, "fc", "ls -I artifacts") == "top\n"


def test_bad_changes_are_refused_and_change_nothing(service: Service) -> None:
    c, s = service.a, {"session_id": "fcbad"}
    c.post("/v1/sandbox/write", json={**s, "path": "keep.txt", "content": "k"}).raise_for_status()
    _bash(c, "fcbad", "ln -s /etc link")
    cases = [
        ("delete", {"path": "../x"}, 400, "path"),
        ("delete", {"path": "/etc/passwd"}, 400, "path"),
        ("delete", {"path": "missing.txt"}, 404, None),
        ("delete", {"path": "."}, 400, None),  # the workspace itself
        ("move", {"source": "keep.txt", "destination": "../out.txt"}, 400, "destination"),
        ("move", {"source": "keep.txt", "destination": "link/passwd"}, 400, None),  # through a symlink out
        ("move", {"source": ".", "destination": "x"}, 400, None),
        ("mkdir", {"path": "keep.txt"}, 409, None),  # a file is there
        ("mkdir", {"path": "a", "extra": 1}, 400, "extra"),
    ]
    for op, body, status, field in cases:
        r = c.post(f"/v1/sandbox/{op}", json={**s, **body})
        assert r.status_code == status, (op, body, r.text)
        err = error_of(r)
        assert err["code"] == "SB002", (op, body, err)
        if field is not None:
            assert field in (err["details"].get("field"), *err["details"].get("fields", [])), (op, body, err)
    assert _bash(c, "fcbad", "cat keep.txt; ls /etc/passwd") == "k/etc/passwd\n"  # nothing changed
    assert c.post("/v1/sandbox/delete", json={**s, "path": "link"}).status_code == 200  # the link itself
    assert _bash(c, "fcbad", "ls -I artifacts; ls /etc/passwd") == "keep.txt\n/etc/passwd\n"


def test_another_tenant_cannot_change_the_session(service: Service) -> None:
    service.a.post("/v1/sandbox/write", json={"session_id": "fcten", "path": "mine.txt", "content": "m"})
    r = service.b.post("/v1/sandbox/delete", json={"session_id": "fcten", "tenant_id": "tenant-a", "path": "mine.txt"})
    assert r.status_code == 403, r.text
    assert _bash(service.a, "fcten", "cat mine.txt") == "m"


def test_the_remote_sdks_change_files(service: Service) -> None:
    with RemoteSandbox(service.url, service.tenant_a, session_id="fcsdk") as sb:
        assert sb.files.mkdir("d/e") is True and sb.files.mkdir("d") is False
        sb.files.write("d/e/x.txt", "x")
        assert sb.files.move("d/e/x.txt", "y.txt") == "y.txt"
        sb.files.delete("d")
        assert sorted(f.path for f in sb.files.list(".", recursive=True) if f.path != "artifacts") == ["y.txt"]

    async def go() -> list[str]:
        async with AsyncRemoteSandbox(service.url, service.tenant_a, session_id="fcasync") as sb:
            assert await sb.files.mkdir("p") is True
            await sb.files.write("p/q.txt", "q")
            assert await sb.files.move("p/q.txt", "p/r.txt") == "p/r.txt"
            await sb.files.delete("p/r.txt")
            return [f.path for f in await sb.files.list(".", recursive=True) if f.path != "artifacts"]

    assert asyncio.run(go()) == ["p"]


DEEP_TREE = ("python3 -c \"import os\nos.mkdir('deep'); os.chdir('deep')\n"
             "for i in range(3000):\n    os.mkdir('a'); os.chdir('a')\n"
             "    if i % 500 == 0: os.symlink('/etc', 'etc')\nprint('made')\"")


def test_deep_trees_are_made_listed_and_deleted(service: Service) -> None:
    """Deeper than Python's recursion limit (review 31, F6): these were 503 SB009 RecursionError, in
    a box whose 1024 open files would not hold a descriptor per level either."""
    c, s = service.a, {"session_id": "fcdeep"}
    assert _bash(c, "fcdeep", DEEP_TREE) == "made\n"
    r = c.post("/v1/sandbox/list", json={**s, "path": "deep", "recursive": True})
    assert r.status_code == 200 and len(r.json()["files"]) > 1000, r.text[:300]  # as deep as a path can name
    r = c.post("/v1/sandbox/delete", json={**s, "path": "deep"})
    assert (r.status_code, r.json()) == (200, {"path": "deep", "deleted": True}), r.text
    assert _bash(c, "fcdeep", "ls -I artifacts; ls /etc/passwd") == "/etc/passwd\n"  # links were not followed
    r = c.post("/v1/sandbox/mkdir", json={**s, "path": "a/" * 1000 + "b"})
    assert (r.status_code, r.json()["created"]) == (200, True), r.text
    r = c.post("/v1/sandbox/mkdir", json={**s, "path": "z/" * 2100 + "b"})  # past PATH_MAX: refused, not 503
    assert r.status_code == 400 and error_of(r)["code"] == "SB002", r.text
    r = c.post("/v1/sandbox/delete", json={**s, "path": "a"})
    assert r.status_code == 200, r.text
