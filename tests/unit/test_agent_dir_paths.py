"""A path that names a directory by its form (``d/``, ``d/.``) is never written or moved to as a
file (review 43 F5): one rule, ``paths.names_directory``, used by writes (write, write_many: the
HTTP copy), move's destination and the E2B facade's writes. And the agent's listing says what each
entry is (``kind``, review 43 F4), a link whose text is not UTF-8 included."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from execbox.agent import fileops, fsextra, paths, writes


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    w.mkdir()
    (w / "f").write_text("F")
    (w / "d").mkdir()
    return w


@pytest.mark.parametrize(("path", "expected"), [
    ("d/", True), ("d/.", True), ("d/./", True), ("a/b/.", True), ("d\\", True), ("d\\.", True),
    (".", True), ("", True), ("d", False), ("./d", False), ("a/./b", False), ("d.", False), (".d", False),
    ("d/..x", False), ("d/x/..", True), ("..", True)])
def test_names_directory(path: str, expected: bool) -> None:
    assert paths.names_directory(path) is expected


@pytest.mark.parametrize("path", ["d2/.", "new/sub/.", "f/.", "d2/./", "x\\."])
def test_a_write_to_a_path_ending_in_a_dot_is_refused_and_changes_nothing(ws: Path, path: str) -> None:
    for mode in writes.MODES:
        with pytest.raises(fileops.FileOpError) as e:
            writes.write(str(ws), path, b"x", mode)
        assert (e.value.status, e.value.code) == (400, "SB002")
        assert "names a directory" in str(e.value) and repr(path) in str(e.value)
    with pytest.raises(fileops.FileOpError) as e:  # the HTTP copy: write_many, all or none
        writes.write_many(str(ws), [{"path": "ok.txt", "content": "a"}, {"path": path, "content": "b"}])
    assert e.value.code == "SB002" and repr(path) in str(e.value)
    assert sorted(os.listdir(ws)) == ["d", "f"] and (ws / "f").read_text() == "F" and not os.listdir(ws / "d")


@pytest.mark.parametrize("dest", ["m1/", "m1/.", "sub/m1/", "f/", "f/."])
def test_a_move_to_a_directory_form_that_is_no_directory_is_refused(ws: Path, dest: str) -> None:
    (ws / "src").write_text("S")
    with pytest.raises(fileops.FileOpError) as e:
        fsextra.move(str(ws), "src", dest)
    assert (e.value.status, e.value.code) == (400, "SB002") and repr(dest) in str(e.value)
    assert e.value.details.get("field") == "destination"
    assert sorted(os.listdir(ws)) == ["d", "f", "src"] and (ws / "f").read_text() == "F"


def test_a_move_to_a_directory_form_through_a_symlink_is_refused(ws: Path) -> None:
    (ws / "src").write_text("S")
    os.symlink("d", ws / "dl")
    with pytest.raises(fileops.FileOpError):
        fsextra.move(str(ws), "src", "dl/")
    assert os.path.islink(ws / "dl") and (ws / "src").read_text() == "S"


def test_a_move_to_an_existing_directory_form_does_what_it_did(ws: Path) -> None:
    """Unchanged where ``m/`` is a directory: a file is not moved into it ('is a directory'); a
    directory replaces an empty one, as rename(2)."""
    (ws / "src").write_text("S")
    with pytest.raises(fileops.FileOpError) as e:
        fsextra.move(str(ws), "src", "d/")
    assert "is a directory" in str(e.value) and (ws / "src").exists()
    (ws / "sd").mkdir()
    (ws / "sd" / "in").write_text("I")
    assert fsextra.move(str(ws), "sd", "d/.") == {"path": "d"}
    assert (ws / "d" / "in").read_text() == "I" and not (ws / "sd").exists()
    assert fsextra.move(str(ws), "src", "m1") == {"path": "m1"}  # no trailing '/': a rename as before


def test_info_says_what_each_entry_is(ws: Path, tmp_path: Path) -> None:
    os.mkfifo(ws / "fifo")
    os.symlink("f", ws / "ok")
    os.symlink(b"/etc/host\xffs", os.fsencode(ws / "bad"))
    short = tmp_path / "s"  # a unix socket's path must be short
    short.mkdir()
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(short / "sock"))
        os.rename(short / "sock", ws / "sock")
        listed = {e["path"]: e for e in fileops.list_dir(str(ws))["files"]}
    finally:
        s.close()
    kinds = {p: e["kind"] for p, e in listed.items()}
    assert kinds == {"bad": "symlink", "d": "dir", "f": "file", "fifo": "fifo", "ok": "symlink", "sock": "socket"}
    assert listed["ok"]["symlink_target"] == "f" and "symlink_target" not in listed["bad"]


@pytest.mark.parametrize("dest", ["m2/", "m2/.", "sub/m3/"])
def test_a_directory_may_be_renamed_to_a_missing_directory_form(ws: Path, dest: str) -> None:
    """As rename(2) and mv: ``mv dir m2/`` makes ``m2`` (review 46 F6: refused since 5e5db92)."""
    (ws / "dir").mkdir()
    (ws / "dir" / "x").write_text("X")
    name = dest.rstrip("/.").rstrip("/")
    assert fsextra.move(str(ws), "dir", dest) == {"path": name}
    assert (ws / name / "x").read_text() == "X" and not (ws / "dir").exists()
