"""The agent's directory operations on trees deeper than Python's recursion limit (review 31, F6):
``os.makedirs``, ``shutil.rmtree`` and ``os.walk`` recurse once per level before Python 3.12, so
mkdir of ~1000 levels, delete of a 3000-deep tree and a recursive listing raised RecursionError
(503 SB009 over HTTP). Now they are loops: a deep tree is removed with a handful of descriptors,
never following a symlink, and a path too long to create is 400 SB002."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from execbox.agent import fileops, fsextra, pump

DEPTH = 3000


@pytest.fixture(autouse=True)
def _nothing_deep_left(tmp_path: Path) -> Iterator[None]:
    """pytest deletes old temp dirs with ``shutil.rmtree``, which recurses once per level before
    Python 3.12: a tree left here made a later pytest run end in RecursionError."""
    yield
    for entry in tmp_path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            fileops.remove_tree(str(entry))
        else:
            entry.unlink()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    w.mkdir()
    return w


@pytest.fixture
def few_descriptors() -> Iterator[None]:
    """A box allows 1024 open files; a removal holding one per level would run out at this depth.
    64 more than this process holds now (a long test session holds hundreds: a fixed 256 failed)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = max(int(name) for name in os.listdir("/proc/self/fd")) + 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(held + 64, soft), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _deep(top: Path, depth: int, every: int = 0, outside: Path | None = None) -> None:
    """``top/a/a/...`` ``depth`` levels deep, made with relative steps (its full path is longer than
    PATH_MAX, as code in a box can make it); every ``every`` levels a file and links to ``outside``."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(depth):
            if every and i % every == 0:
                os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
                assert outside is not None
                os.symlink(outside, "out_dir", dir_fd=fd)
                os.symlink(outside / "keep.txt", "out_file", dir_fd=fd)
            os.mkdir("a", dir_fd=fd)
            child = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def test_a_tree_deeper_than_the_recursion_limit_is_deleted(tmp_path: Path, ws: Path, few_descriptors: None) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("host")
    _deep(ws / "deep", DEPTH, every=250, outside=outside)
    (ws / "other.txt").write_text("stays")
    fileops.delete(str(ws), "deep")
    assert sorted(os.listdir(ws)) == ["other.txt"]
    assert os.listdir(outside) == ["keep.txt"] and (outside / "keep.txt").read_text() == "host"  # links not followed


def test_the_agents_own_temp_dir_goes_however_deep(tmp_path: Path, few_descriptors: None) -> None:
    _deep(tmp_path / "tmp", DEPTH)
    fileops.remove_tree(str(tmp_path / "tmp"))
    assert not (tmp_path / "tmp").exists()


def test_a_directory_moved_out_from_under_a_delete_stops_it(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The climb back up checks each directory is the one it came down from: the removal never
    continues in a directory outside the tree it was asked for."""
    (ws / "elsewhere").mkdir()
    (ws / "elsewhere" / "precious.txt").write_text("p")
    _deep(ws / "deep", 5)
    clear, calls = fileops._clear_dir, []

    def moving(fd: int, strict: bool) -> list[str]:
        calls.append(fd)
        if len(calls) == 3:  # two levels down: move the first level elsewhere
            os.rename(ws / "deep" / "a", ws / "elsewhere" / "a")
        return clear(fd, strict)

    monkeypatch.setattr(fileops, "_clear_dir", moving)
    with pytest.raises(fileops.FileOpError) as moved:
        fileops.delete(str(ws), "deep")
    assert moved.value.status == 409 and "changed while it was being deleted" in str(moved.value)
    assert (ws / "elsewhere" / "precious.txt").read_text() == "p"


def test_deep_mkdir_works_up_to_the_path_limit(ws: Path) -> None:
    deep = "a/" * 1000 + "b"
    assert fsextra.make_dir(str(ws), deep) == {"created": True}
    assert (ws / deep).is_dir()
    assert fsextra.make_dir(str(ws), deep) == {"created": False}
    (ws / "f.txt").write_text("x")
    assert fsextra.move(str(ws), "f.txt", "m/" * 1000 + "f.txt") == {"path": "m/" * 1000 + "f.txt"}
    with pytest.raises(fileops.FileOpError) as too_long:  # past PATH_MAX: a clear 400, nothing made
        fsextra.make_dir(str(ws), "z/" * 2100 + "b")
    assert (too_long.value.status, too_long.value.code) == (400, "SB002") and not (ws / "z").exists()
    with pytest.raises(fileops.FileOpError) as a_file:  # a file as a parent: 400, as os.makedirs gave
        fsextra.make_dir(str(ws), "m/" * 1000 + "f.txt/sub")
    assert a_file.value.status == 400 and "not a directory" in str(a_file.value)


def test_a_deep_tree_is_listed_and_the_order_is_os_walks(ws: Path) -> None:
    _deep(ws / "deep", 1500)
    listed = fileops.list_dir(str(ws), ".", recursive=True)["files"]
    assert len(listed) == 1501 and listed[-1]["path"] == "deep" + "/a" * 1500
    for d in ("b/y", "b/x", "a", "c"):
        (ws / "tree" / d).mkdir(parents=True)
    for f in ("z.txt", "b/x/1.txt", "b/0.txt", "a/q.txt"):
        (ws / "tree" / f).write_text("")
    os.symlink("b", ws / "tree" / "link_dir")  # listed among directories, not walked into
    os.symlink("nowhere", ws / "tree" / "dangling")
    got = [e["path"] for e in fileops.list_dir(str(ws), "tree", recursive=True)["files"]]
    expected = []
    for top, dirs, files in os.walk(ws / "tree"):
        dirs.sort()
        expected += [os.path.relpath(os.path.join(top, n), ws) for n in dirs + sorted(files)]
    assert got == expected
    assert got[:5] == ["tree/a", "tree/b", "tree/c", "tree/link_dir", "tree/dangling"]


def test_a_runs_artifact_snapshot_walks_a_deep_tree(tmp_path: Path) -> None:
    """A run compares artifacts/ before and after (pump.snapshot): with os.walk, a tree ~1000 deep
    made every later run of the session fail with RecursionError (SB009)."""
    art = tmp_path / "artifacts"
    _deep(art, 1500)
    bottom = art / ("a/" * 1500 + "f.txt")
    bottom.write_text("x")
    (art / "top.txt").write_text("yy")
    (art / ".hidden").mkdir()
    (art / ".hidden" / "h.txt").write_text("h")
    (tmp_path / "outside.txt").write_text("o")
    os.symlink(tmp_path / "outside.txt", art / "link.txt")
    snap = pump.snapshot(str(art))
    assert set(snap) == {"a/" * 1500 + "f.txt", "top.txt"}
    assert snap["top.txt"][1] == 2 and snap["a/" * 1500 + "f.txt"][1] == 1
