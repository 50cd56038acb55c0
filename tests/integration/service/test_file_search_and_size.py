"""Search and size limits of the file API, end to end on a real service (jail boxes): review 29's
findings 1-3 and 11, review 28's finding 6.

grep searches files of any size and says what it left out; grep's and glob's ``truncated`` reach
the HTTP reply and the SDK; a file over 64 MiB can be paged as text and fetched in byte ranges;
a base64 write is bounded by its decoded size; the SDK's text read of a binary file names the
SDK's own method."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

from execbox import RemoteSandbox
from execbox.agent.fileops import MAX_READ_BYTES
from execbox.errors import InvalidConfigError, NotTextError, PayloadTooLargeError

from .conftest import Service, error_of

pytestmark = pytest.mark.jail

BIG_LINES = 9_000_000  # `seq 1 9000000`: 76 MB of text, over the 64 MiB of one read


def _bash(c: Any, session: str, command: str) -> dict[str, Any]:
    r = c.post("/v1/sandbox/bash", json={"session_id": session, "command": command, "timeout": 120})
    assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
    return r.json()


@pytest.fixture(scope="module")
def big(service: Service) -> Iterator[dict[str, Any]]:
    """A session holding big.log (over 64 MiB) and its sha256 as the box computes it; ``sdk``: a
    RemoteSandbox on it (closed, with the session, once the module is done)."""
    c = service.a
    out = _bash(c, "big", f"seq 1 {BIG_LINES} > big.log && stat -c %s big.log && sha256sum big.log")
    size, digest = out["stdout"].split()[:2]
    assert int(size) > MAX_READ_BYTES
    with RemoteSandbox(service.url, service.tenant_a, session_id="big") as sb:
        yield {"session_id": "big", "size": int(size), "sha256": digest, "sdk": sb}


def test_grep_finds_a_line_in_a_file_over_8_mib_named_or_walked(service: Service, big: dict[str, Any]) -> None:
    c = service.a
    for path in ("big.log", "."):
        r = c.post("/v1/sandbox/grep", json={"session_id": "big", "pattern": "^1234567$", "path": path})
        assert r.status_code == 200, r.text
        assert r.json() == {"matches": [{"path": "big.log", "line_number": 1234567, "line": "1234567"}],
                            "truncated": False, "binary_matches": [], "skipped": [], "skipped_names": 0}


def test_grep_reports_truncation_binary_matches_and_skipped_files(service: Service) -> None:
    c = service.a
    s = {"session_id": "gr"}
    _bash(c, "gr", "printf 'x1\\nx2\\nx3\\n' > s.txt && printf '\\0\\1 x9\\n' > b.bin && mkfifo pipe")
    r = c.post("/v1/sandbox/grep", json={**s, "pattern": "x[1-3]", "max_results": 2}).json()
    assert len(r["matches"]) == 2 and r["truncated"] is True
    r = c.post("/v1/sandbox/grep", json={**s, "pattern": "x", "max_results": 2}).json()  # b.bin counts too
    assert r["binary_matches"] == ["b.bin"] and len(r["matches"]) == 1 and r["truncated"] is True
    r = c.post("/v1/sandbox/grep", json={**s, "pattern": "x[0-9]"}).json()
    assert [m["line"] for m in r["matches"]] == ["x1", "x2", "x3"] and r["truncated"] is False
    assert r["binary_matches"] == ["b.bin"] and r["skipped"] == [{"path": "pipe", "reason": "not_regular"}]
    named = c.post("/v1/sandbox/grep", json={**s, "pattern": "x", "path": "pipe"})
    assert named.status_code == 400 and "FIFO" in error_of(named)["message"]
    with RemoteSandbox(service.url, service.tenant_a, session_id="gr") as sb:  # closes the session
        hits = sb.files.grep("x[1-3]", max_results=2)
        assert [h.line for h in hits] == ["x1", "x2"] and hits.truncated is True
        full = sb.files.grep("x[0-9]")
        assert full.truncated is False and full.binary_matches == ["b.bin"]
        assert full.skipped == [{"path": "pipe", "reason": "not_regular"}]


def test_glob_takes_max_results_and_says_when_it_stopped(service: Service) -> None:
    c = service.a
    s = {"session_id": "gl"}
    _bash(c, "gl", "mkdir many && for i in $(seq 1 1500); do : > many/$i.txt; done")
    r = c.post("/v1/sandbox/glob", json={**s, "pattern": "many/*.txt"}).json()
    assert len(r["paths"]) == 1000 and r["truncated"] is True  # the default cap, now said
    r = c.post("/v1/sandbox/glob", json={**s, "pattern": "many/*.txt", "max_results": 2000}).json()
    assert len(r["paths"]) == 1500 and r["truncated"] is False
    r = c.post("/v1/sandbox/glob", json={**s, "pattern": "many/1?.txt", "max_results": 3}).json()
    assert r == {"paths": ["many/10.txt", "many/11.txt", "many/12.txt"], "truncated": True, "skipped_names": 0}
    for bad in (0, -1, 10001, "ten", 2.5):
        e = c.post("/v1/sandbox/glob", json={**s, "pattern": "*", "max_results": bad})
        assert e.status_code == 400 and error_of(e)["code"] == "SB002", bad
        assert error_of(e)["details"]["field"] == "max_results", bad
    with RemoteSandbox(service.url, service.tenant_a, session_id="gl") as sb:
        capped = sb.files.glob("many/*.txt", max_results=10)
        assert len(capped) == 10 and capped.truncated is True
        assert sb.files.glob("many/7.txt").truncated is False


def test_a_file_over_64_mib_is_paged_as_text(service: Service, big: dict[str, Any]) -> None:
    c = service.a
    r = c.post("/v1/sandbox/read", json={"session_id": "big", "path": "big.log", "offset": 10, "limit": 3})
    assert r.status_code == 200, r.text
    assert r.json() == {"path": "big.log", "content": "11\n12\n13\n", "offset": 10, "limit": 3,
                        "total_lines": BIG_LINES, "truncated": True}
    page = big["sdk"].files.read("big.log", offset=BIG_LINES - 2, limit=10)
    assert page.content == f"{BIG_LINES - 1}\n{BIG_LINES}\n" and not page.truncated


def test_a_file_over_64_mib_is_fetched_in_byte_ranges(service: Service, big: dict[str, Any]) -> None:
    c = service.a
    s = {"session_id": "big", "path": "big.log"}
    whole = c.post("/v1/sandbox/read_binary", json=s)
    assert whole.status_code == 413 and error_of(whole)["code"] == "SB002"
    assert error_of(whole)["details"] == {"path": "big.log", "size": big["size"], "limit": MAX_READ_BYTES}
    assert "offset and length" in error_of(whole)["message"]
    r = c.post("/v1/sandbox/read_binary", json={**s, "offset": 18, "length": 6}).json()
    assert base64.b64decode(r["content_b64"]) == b"10\n11\n" and r["size"] == 6
    assert r["offset"] == 18 and r["total_size"] == big["size"]
    assert r["sha256"] == hashlib.sha256(b"10\n11\n").hexdigest()
    digest = hashlib.sha256()
    sb = big["sdk"]
    offset = 0
    while True:
        piece = sb.files.read_bytes("big.log", offset=offset, length=32 * 1024 * 1024)
        assert piece.total_size == big["size"] and piece.offset == offset
        if not piece:
            break
        digest.update(piece)
        offset += len(piece)
    assert offset == big["size"] and digest.hexdigest() == big["sha256"]
    with pytest.raises(PayloadTooLargeError) as e:
        sb.files.read_bytes("big.log")
    assert e.value.details["limit"] == MAX_READ_BYTES
    for bad, field in (({"offset": -1}, "offset"), ({"length": -1}, "length"),
                       ({"length": MAX_READ_BYTES + 1}, "length"), ({"offset": "x"}, "offset"),
                       ({"offset": big["size"] + 1}, "offset")):
        e = c.post("/v1/sandbox/read_binary", json={**s, **bad})
        assert e.status_code == 400 and error_of(e)["code"] == "SB002", bad
        assert error_of(e)["details"]["field"] == field, bad


def test_a_base64_write_is_bounded_by_its_decoded_size(service_factory: Any) -> None:
    svc = service_factory(max_file_bytes=2000)
    c = svc.a
    for size in (2001, 2002):  # their base64 is within the encoded bound: only the decoded size tells
        r = c.post("/v1/sandbox/write", json={"session_id": "w", "path": "f.bin",
                                              "content_b64": base64.b64encode(b"x" * size).decode()})
        assert r.status_code == 413, (size, r.text)
        assert error_of(r)["details"] == {"field": "content_b64", "size": size, "limit": 2000}
    ok = c.post("/v1/sandbox/write", json={"session_id": "w", "path": "f.bin",
                                           "content_b64": base64.b64encode(b"x" * 2000).decode()})
    assert ok.status_code == 200 and ok.json()["size"] == 2000
    copy = c.post("/v1/sandbox/sessions/tenant-a/w/copy",
                  json={"files": [{"path": "g.bin", "content_b64": base64.b64encode(b"y" * 2002).decode()}]})
    assert copy.status_code == 413 and error_of(copy)["details"]["field"] == "files.0.content_b64"


def test_content_and_content_b64_together_is_a_clear_message(service: Service) -> None:
    c = service.a
    r = c.post("/v1/sandbox/write", json={"session_id": "w2", "path": "f", "content": "a", "content_b64": "YQ=="})
    assert r.status_code == 400
    assert error_of(r)["message"] == "give exactly one of content or content_b64"
    assert error_of(r)["details"]["field"] == "content"
    r = c.post("/v1/sandbox/sessions/tenant-a/w2/copy", json={"files": [{"path": "f"}]})
    assert error_of(r)["message"] == "files.0: give exactly one of content or content_b64"


def test_the_sdk_text_read_of_a_binary_file_names_read_bytes(service: Service) -> None:
    service.a.post("/v1/sandbox/write", json={"session_id": "bin", "path": "b.bin", "content_b64": "AAEC"})
    r = service.a.post("/v1/sandbox/read", json={"session_id": "bin", "path": "b.bin"})
    assert r.status_code == 400 and "read_binary" in error_of(r)["message"]  # HTTP names its own route
    with RemoteSandbox(service.url, service.tenant_a, session_id="bin") as sb:
        sb.files.write("b.bin", b"\x00\x01\x02")
        with pytest.raises(NotTextError) as e:
            sb.files.read("b.bin")
        assert isinstance(e.value, InvalidConfigError) and e.value.code == "SB002"  # still caught as before
        assert "files.read_bytes('b.bin')" in e.value.message and "read_binary" not in e.value.message
        assert e.value.details["reason"] == "binary"


def test_the_async_sdk_carries_the_same(service: Service) -> None:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from execbox import AsyncRemoteSandbox

    async def go() -> None:
        async with await AsyncRemoteSandbox.create(service.url, service.tenant_a) as sb:
            await sb.files.write_many({"a.txt": "hit\nhit\nhit\n", "z.bin": b"\x00hit"})
            hits = await sb.files.grep("hit", max_results=2)
            assert len(hits) == 2 and hits.truncated is True and hits.binary_matches == []
            assert (await sb.files.grep("hit", glob="*.bin")).binary_matches == ["z.bin"]
            paths = await sb.files.glob("*.*", max_results=1)
            assert paths == ["a.txt"] and paths.truncated is True
            piece = await sb.files.read_bytes("a.txt", offset=4, length=100)
            assert piece == b"hit\nhit\n" and piece.offset == 4 and piece.total_size == 12
            with pytest.raises(NotTextError, match=r"files\.read_bytes\('z\.bin'\)"):
                await sb.files.read("z.bin")

    with ThreadPoolExecutor(1) as pool:  # a fresh thread: another suite may own this one's event loop
        pool.submit(asyncio.run, go()).result()
