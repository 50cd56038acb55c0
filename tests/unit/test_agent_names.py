"""File names that are not valid UTF-8 (``open(b'ws\\xff', 'w')`` in user code) never break a reply:
listings, glob, grep and a run's artifacts leave them out and count them, a request naming one is
refused by the path validator, and a reply that still holds one becomes an SB002 error reply.

The protocol is UTF-8 JSON; os.listdir gives such names as lone surrogates, which have no UTF-8 form.
Before, one such name turned every listing (and a run's whole reply, output included) into SB009."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from execbox.agent import fileops, paths, protocol, pump, search

from .test_agent_request_order import RawAgent, agent  # noqa: F401 - the raw agent fixture

BAD_FILE = b"ws\xff"
BAD_DIR = b"d\xfe"


def _decodable(value: object) -> object:
    """``value`` after a trip through a frame: encoding it must work (strict UTF-8)."""
    return protocol.FrameBuffer().feed(protocol.encode_frame({"id": 1, "ok": True, "value": value}))[0]["value"]


@pytest.fixture
def ws(tmp_path: Path) -> str:
    w = tmp_path / "ws"
    (w / "sub").mkdir(parents=True)
    (w / "sub" / "ok.txt").write_text("needle\n")
    (w / "top.txt").write_text("needle\n")
    root = os.fsencode(w)
    with open(os.path.join(root, BAD_FILE), "wb") as f:
        f.write(b"needle\n")
    os.mkdir(os.path.join(root, BAD_DIR))
    with open(os.path.join(root, BAD_DIR, b"inner.txt"), "wb") as f:
        f.write(b"needle\n")
    return str(w)


@pytest.mark.parametrize("recursive", [False, True])
def test_listing_leaves_out_and_counts_names_that_are_not_utf8(ws: str, recursive: bool) -> None:
    value = _decodable(fileops.list_dir(ws, ".", recursive))
    listed = sorted(f["path"] for f in value["files"])
    assert listed == (["sub", "sub/ok.txt", "top.txt"] if recursive else ["sub", "top.txt"])
    assert value["skipped_names"] == 2  # the file and the directory (with what is inside it)
    assert "skipped_names" not in fileops.list_dir(ws, "sub", recursive)  # nothing left out: no key


def test_glob_and_grep_leave_out_names_that_are_not_utf8(ws: str) -> None:
    globbed = _decodable(search.glob(ws, "**/*", timeout=10))
    assert sorted(globbed["paths"]) == ["sub", "sub/ok.txt", "top.txt"] and globbed["skipped_names"] == 2
    grepped = _decodable(search.grep(ws, "needle", ".", timeout=10))
    assert sorted(m["path"] for m in grepped["matches"]) == ["sub/ok.txt", "top.txt"]
    assert grepped["skipped_names"] == 2


def test_a_request_naming_such_a_path_is_refused_by_the_validator(ws: str) -> None:
    for bad in ("ws\udcff", "d\udcfe/inner.txt", "sub/\ud800"):
        with pytest.raises(paths.PathViolation) as e:
            paths.resolve(ws, bad)
        assert e.value.reason == "path is not valid UTF-8"
        assert paths.is_utf8(str(e.value)) and paths.is_utf8(e.value.path)  # the error itself can be sent
    os.symlink(os.fsdecode(BAD_DIR), os.path.join(ws, "link"))  # a valid name that leads to an invalid one
    with pytest.raises(paths.PathViolation) as e:
        paths.resolve(ws, "link/inner.txt")
    assert "not valid UTF-8" in e.value.reason
    with pytest.raises(fileops.FileOpError) as fe:
        fileops.list_dir(ws, "link")
    assert fe.value.code == "SB002" and fe.value.status == 400 and fe.value.details["violation"]


def test_artifacts_leave_out_new_names_that_are_not_utf8(tmp_path: Path) -> None:
    art = os.fsencode(tmp_path / "artifacts")
    os.mkdir(art)
    with open(os.path.join(art, b"old\xff.bin"), "wb") as f:
        f.write(b"before the run")
    before = pump.snapshot(os.fsdecode(art))
    for name in (b"\xff\xfe.bin", b"plot.png"):
        with open(os.path.join(art, name), "wb") as f:
            f.write(b"x")
    found, skipped = pump.collect_artifacts(os.fsdecode(art), before, "artifacts", inline=True)
    assert [a["name"] for a in _decodable(found)] == ["plot.png"]
    assert skipped == 1  # the new one only: a name left from before is not news
    assert "1 new or changed file(s) in artifacts/" in pump.skipped_artifacts_note(skipped)
    assert pump.skipped_artifacts_note(0) == ""


def test_a_reply_that_cannot_be_encoded_becomes_an_sb002_error_reply() -> None:
    frame = protocol.encode_frame({"id": 9, "ok": True, "value": {"files": [{"path": "a"}, {"path": "x\udcff"}]}})
    (reply,) = protocol.FrameBuffer().feed(frame)
    assert reply["id"] == 9 and reply["ok"] is False
    assert reply["error"]["code"] == "SB002" and reply["error"]["status"] == 400
    assert reply["error"]["details"]["field"] == "value.files.1.path"
    assert "not valid UTF-8" in reply["error"]["message"]
    with pytest.raises(UnicodeEncodeError):  # not a reply: the sender's to report (the host: SB002 naming the field)
        protocol.encode_frame({"id": 9, "op": "files.read", "path": "\udcff"})


MAKE_BAD_NAMES = ("import os\nos.makedirs('artifacts', exist_ok=True)\n"
                  "open(b'artifacts/\\xff\\xfe.bin', 'wb').write(b'x')\nopen('artifacts/ok.txt', 'w').write('y')\n"
                  "open(b'ws\\xff', 'wb').write(b'needle')\nprint('made')")


def test_through_the_agent_a_run_and_every_listing_still_answer(agent: RawAgent) -> None:  # noqa: F811
    agent.send_together({"id": 1, "op": "exec", "language": "python", "code": MAKE_BAD_NAMES, "timeout": 30})
    run = agent.reply(1, timeout=30)
    assert run is not None and run["ok"], run  # was SB009 "UnicodeEncodeError ... surrogates not allowed"
    assert run["value"]["stdout"] == "made\n" and run["value"]["exit_code"] == 0
    assert [a["name"] for a in run["value"]["artifacts"]] == ["ok.txt"]
    assert "not returned as artifacts" in run["value"]["stderr"]
    agent.send_together({"id": 2, "op": "files.list", "path": ".", "recursive": True},
                        {"id": 3, "op": "files.glob", "pattern": "**/*"},
                        {"id": 4, "op": "files.grep", "pattern": "needle", "path": "."})
    body = json.dumps({"id": 5, "op": "files.read", "path": "ws\udcff"}).encode()  # as "ws\\udcff": ASCII JSON
    os.write(agent.w, protocol.HEADER.pack(len(body)) + body)
    listed, globbed, grepped, read = (agent.reply(i, timeout=30) for i in (2, 3, 4, 5))
    assert listed["ok"] and sorted(f["path"] for f in listed["value"]["files"]) == [
        "artifacts", "artifacts/ok.txt"] and listed["value"]["skipped_names"] == 2
    assert globbed["ok"] and sorted(globbed["value"]["paths"]) == ["artifacts", "artifacts/ok.txt"]
    assert grepped["ok"] and grepped["value"]["matches"] == []
    assert not read["ok"] and read["error"]["code"] == "SB002" and read["error"]["details"]["violation"]
    agent.send_together({"id": 6, "op": "files.read_bytes", "path": "artifacts/ok.txt"})
    assert base64.b64decode(agent.reply(6, timeout=10)["value"]["content_b64"]) == b"y"
