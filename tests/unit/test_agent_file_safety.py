"""The agent's file operations under failure and abuse: batch writes all or none (rolled back when a
rename fails part-way), remove/rename of symlinks act on the link, FIFOs are refused without
blocking, a catastrophic regex is stopped by grep's time limit."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from execbox.agent import fileops, fsextra, search, writes


def _hidden(ws: Path) -> list[str]:
    return [str(p.relative_to(ws)) for p in ws.rglob(".execbox-*")]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    w.mkdir()
    (w / "config.json").write_text("OLD")
    return w


def test_batch_rename_failing_part_way_restores_everything(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_replace = os.replace
    calls = []

    def flaky(src: str, dst: str) -> None:  # the 3rd file's commit fails (say, a racing directory)
        calls.append(dst)
        if dst.endswith("c.txt") and not os.path.basename(src).startswith("c"):
            raise OSError(errno.EISDIR, "Is a directory", src)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(fileops.FileOpError) as e:
        writes.write_many(str(ws), [{"path": "config.json", "content": "NEW"},
                                    {"path": "new/deep/b.txt", "content": "b"}, {"path": "c.txt", "content": "c"}])
    assert e.value.status == 400 and e.value.code == "SB002"
    assert "'c.txt'" in str(e.value) and ".execbox" not in str(e.value) and str(ws) not in str(e.value)
    assert (ws / "config.json").read_text() == "OLD"  # restored from its backup
    assert not (ws / "new").exists()  # directories the batch made are gone
    assert sorted(os.listdir(ws)) == ["config.json"] and _hidden(ws) == []


@pytest.mark.parametrize("files", [
    [{"path": "config.json", "content": "NEW"}, {"path": "n" * 256, "content": "x"}],  # over NAME_MAX
    [{"path": "config.json", "content": "NEW"}, {"path": "f", "content": "file"}, {"path": "f/g", "content": "x"}],
    [{"path": "config.json", "content": "NEW"}, {"path": "made/x", "content": "1"}, {"path": "config.json/y"}],
    [{"path": "config.json", "content": "NEW"}, {"path": "d/" * 2030 + "x", "content": "deep"}],  # PATH_MAX
])
def test_batch_refused_up_front_touches_nothing(ws: Path, files: list[dict]) -> None:
    with pytest.raises(fileops.FileOpError) as e:
        writes.write_many(str(ws), files)
    assert e.value.status == 400 and e.value.code == "SB002", e.value
    assert ".execbox" not in str(e.value) and str(ws) not in str(e.value)
    assert (ws / "config.json").read_text() == "OLD"
    assert sorted(os.listdir(ws)) == ["config.json"]


def test_single_write_removes_its_temp_file_when_the_rename_fails(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(src: str, dst: str) -> None:
        raise OSError(errno.ENAMETOOLONG, "File name too long", dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(fileops.FileOpError) as e:
        writes.write(str(ws), "sub/a.txt", b"data")
    assert e.value.status == 400 and "'sub/a.txt'" in str(e.value) and ".execbox" not in str(e.value)
    assert sorted(os.listdir(ws)) == ["config.json"] and _hidden(ws) == []


def test_batch_success_keeps_permissions_and_leaves_no_backups(ws: Path) -> None:
    (ws / "run.sh").write_text("old")
    os.chmod(ws / "run.sh", 0o750)
    out = writes.write_many(str(ws), [{"path": "run.sh", "content": "new"}, {"path": "a/b.txt", "content": "b"}])
    assert [f["path"] for f in out] == ["run.sh", "a/b.txt"]
    assert (ws / "run.sh").read_text() == "new" and (ws / "run.sh").stat().st_mode & 0o777 == 0o750
    assert _hidden(ws) == []


def test_remove_and_rename_act_on_the_symlink_itself(tmp_path: Path, ws: Path) -> None:
    (ws / "data").mkdir()
    (ws / "data" / "db.txt").write_text("precious")
    outside = tmp_path / "outside.txt"
    outside.write_text("host")
    os.symlink("data/db.txt", ws / "link.txt")
    os.symlink("data", ws / "cache")
    os.symlink(outside, ws / "out")
    fileops.delete(str(ws), "link.txt")
    fileops.delete(str(ws), "cache")
    assert (ws / "data" / "db.txt").read_text() == "precious"
    assert not os.path.lexists(ws / "link.txt") and not os.path.lexists(ws / "cache")
    assert fsextra.move(str(ws), "out", "moved") == {"path": "moved"}  # a link out: renamed, not followed
    assert os.readlink(ws / "moved") == str(outside) and outside.read_text() == "host"
    with pytest.raises(fileops.FileOpError) as escape:  # and still never read through
        fileops.read_bytes(str(ws), "moved")
    assert escape.value.details["violation"].startswith("resolves outside")
    fileops.delete(str(ws), "moved")
    assert not os.path.lexists(ws / "moved") and outside.read_text() == "host"
    os.symlink("data/db.txt", ws / "l2")
    os.symlink("data", ws / "d2")
    fsextra.move(str(ws), "config.json", "l2")  # replaces the link, not db.txt
    fileops.delete(str(ws), "d2/db.txt")  # through a link to a directory inside: the file in it
    assert os.path.isfile(ws / "l2") and not os.path.islink(ws / "l2") and not (ws / "data" / "db.txt").exists()


def _within(seconds: float, fn) -> BaseException | object:  # noqa: ANN001
    """fn()'s result or exception, or fail if it is still blocked after ``seconds``."""
    box: list = []

    def call() -> None:
        try:
            box.append(fn())
        except BaseException as e:  # noqa: BLE001
            box.append(e)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(seconds)
    return box[0] if box else pytest.fail(f"still blocked after {seconds} s")


def test_fifo_is_refused_without_blocking(ws: Path) -> None:
    os.mkfifo(ws / "p")
    (ws / "d").mkdir()
    os.mkfifo(ws / "d" / "q")
    (ws / "d" / "h.txt").write_text("hello\n")
    try:
        for fn in (lambda: fileops.read_bytes(str(ws), "p"), lambda: fileops.read_text(str(ws), "d/q"),
                   lambda: writes.write(str(ws), "p", b"x", "append")):
            err = _within(3, fn)
            assert isinstance(err, fileops.FileOpError) and err.status == 400 and "FIFO" in str(err), err
        assert _within(5, lambda: search.grep(str(ws), "hel", "d"))["matches"][0]["path"] == "d/h.txt"
    finally:  # release a reader that did block (an unfixed agent), so the test process can exit
        for p in ("p", "d/q"):
            try:
                os.close(os.open(ws / p, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass


def test_catastrophic_regex_is_stopped_by_the_time_limit(ws: Path) -> None:
    (ws / "r.txt").write_text("a" * 26 + "!\n")  # ~10 s of backtracking in one process here
    start = time.monotonic()
    with pytest.raises(fileops.FileOpError) as e:
        search.grep(str(ws), "(a+)+$", timeout=0.5)
    assert e.value.code == "SB005" and e.value.status == 408
    assert time.monotonic() - start < 3
    assert search.grep(str(ws), "OLD", timeout=5)["matches"] == [
        {"path": "config.json", "line_number": 1, "line": "OLD"}]
    with pytest.raises(fileops.FileOpError) as missing:  # errors in the worker come back typed
        search.grep(str(ws), "x", "nope")
    assert missing.value.status == 404


@pytest.mark.parametrize("path", ["dir/", "sub/dir/", "config.json/", "new\\"])
def test_a_write_to_a_path_ending_in_a_slash_is_refused_and_changes_nothing(ws: Path, path: str) -> None:
    """``dir/`` names a directory (open(2) refuses it with EISDIR): writing a file ``dir`` instead
    would surprise, and over an existing file would replace what was meant as a directory's parent."""
    for mode in ("overwrite", "append", "create"):
        with pytest.raises(fileops.FileOpError) as e:
            writes.write(str(ws), path, b"x", mode)
        assert e.value.status == 400 and "names a directory" in str(e.value) and repr(path) in str(e.value)
    with pytest.raises(fileops.FileOpError):
        writes.write_many(str(ws), [{"path": "ok.txt", "content": "a"}, {"path": path, "content": "b"}])
    assert sorted(os.listdir(ws)) == ["config.json"] and (ws / "config.json").read_text() == "OLD"


def test_a_nul_in_a_path_is_named_once_escaped() -> None:
    from execbox.agent import paths

    with pytest.raises(paths.PathViolation) as e:
        paths.check_syntax("a\x00b")
    assert str(e.value) == "invalid path 'a\\x00b': NUL byte in path"
