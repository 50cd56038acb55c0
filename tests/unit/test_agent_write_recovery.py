"""A write the agent does not live to finish (its box or the service killed mid-write, review 21)
is finished or undone by the next agent on the workspace (agent/writes.py, the journal): a copy of
several files is all or nothing across crashes, a single file is old or new, and no `.execbox-*`
temp file is left to hold the disk quota. A crash is a child process that dies (os._exit) at the
k-th rename, with nothing of the rollback run."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from execbox.agent import fileops, search, write_journal, writes
from execbox.providers.local import LocalProvider

FILES = ("a.txt", "sub/b.txt", "c.txt")


def _hidden(ws: Path) -> list[str]:
    return sorted(str(p.relative_to(ws)) for p in ws.rglob(".execbox-*"))


def _die_at_rename(ws: Path, k: int, batch: list[tuple[str, bytes]], no_links: bool = False) -> None:
    """Write ``batch`` in a child that dies at its k-th os.replace (0-based), rollback unrun."""
    pid = os.fork()
    if pid == 0:
        calls = [0]
        real_replace = os.replace

        def dying(src, dst):  # noqa: ANN001, ANN202
            if calls[0] == k:
                os._exit(9)
            calls[0] += 1
            real_replace(src, dst)

        os.replace = dying
        if no_links:  # a filesystem without hard links: the old file is renamed aside instead
            def no_link(*_a, **_k):  # noqa: ANN002, ANN003, ANN202
                raise OSError(1, "Operation not permitted")
            os.link = no_link
        try:
            if len(batch) == 1:
                writes.write(str(ws), batch[0][0], batch[0][1])
            else:
                writes.write_many(str(ws), [{"path": p, "content": c.decode()} for p, c in batch])
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) in (0, 9)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    (w / "sub").mkdir(parents=True)
    for name in FILES:
        (w / name).write_text("old")
    return w


@pytest.mark.parametrize("no_links", [False, True])
@pytest.mark.parametrize("k", range(5))
def test_a_batch_cut_off_at_any_rename_is_all_old_or_all_new_after_recovery(ws: Path, k: int, no_links: bool):
    _die_at_rename(ws, k, [(name, b"new") for name in FILES], no_links)
    assert write_journal.recover(str(ws)) == (1 if k < 4 else 0)  # k = 4: it finished
    contents = {(ws / name).read_text() for name in FILES}
    # the first rename is the journal's commit mark: dying there undoes the batch, after it the
    # batch is rolled forward
    assert contents == ({"old"} if k == 0 else {"new"}), (k, contents)
    assert _hidden(ws) == [], k


@pytest.mark.parametrize("no_links", [False, True])
def test_a_single_write_cut_off_at_its_rename_leaves_the_old_file_and_nothing_else(ws: Path, no_links: bool):
    _die_at_rename(ws, 0, [("sub/b.txt", b"new")], no_links)
    assert write_journal.recover(str(ws)) == 1
    assert (ws / "sub/b.txt").read_text() == "old" and _hidden(ws) == []


def test_a_journal_naming_a_path_outside_the_workspace_touches_nothing_there(ws: Path, tmp_path: Path):
    outside = tmp_path / "outside.txt"
    outside.write_text("host file")
    (tmp_path / ".execbox-0123456789ab-0").write_text("planted")
    jdir = ws / write_journal.JOURNAL
    jdir.mkdir()
    (jdir / "0123456789ab.json").write_text('{"v": 1, "committed": true, "targets": ["../outside.txt"]}')
    write_journal.recover(str(ws))
    assert outside.read_text() == "host file" and (tmp_path / ".execbox-0123456789ab-0").exists()
    assert not jdir.exists()


def test_the_next_agent_recovers_the_workspace_and_glob_shows_no_temp_file(ws: Path):
    _die_at_rename(ws, 2, [(name, b"new") for name in FILES])  # killed mid-commit
    assert _hidden(ws)  # a temp file and the journal are left
    p = LocalProvider()
    p.initialize({"max_memory": "256m"})
    box = p.start_box(str(ws))
    try:
        assert {(ws / name).read_text() for name in FILES} == {"new"} and _hidden(ws) == []
    finally:
        box.destroy()
        p.shutdown()
    (ws / ".execbox-leftover").write_text("x")  # e.g. from before journals
    found = search.glob(str(ws), "**")
    assert "a.txt" in found["paths"], found
    assert not [m for m in found["paths"] if ".execbox" in m], found


# -- what user code can put where the journal goes (review 22): the agent still starts, and
# -- recovery touches nothing it should not -----------------------------------------------------
def _journal_dir(ws: Path) -> Path:
    d = ws / write_journal.JOURNAL
    d.mkdir()
    return d


def _recover_in_time(ws: Path) -> int:
    done = threading.Event()
    handled: list[int] = []
    threading.Thread(target=lambda: (handled.append(write_journal.recover(str(ws))), done.set()), daemon=True).start()
    assert done.wait(20), "recovery blocked"
    return handled[0]


@pytest.mark.parametrize("kind", ["fifo", "nested", "huge"])
def test_a_fifo_or_a_deeply_nested_or_huge_journal_does_not_stop_the_start(ws: Path, kind: str):
    journal = _journal_dir(ws) / "0123456789ab.json"
    if kind == "fifo":
        os.mkfifo(journal)
    elif kind == "nested":
        journal.write_text("[" * 200_000)
    else:
        journal.write_text('{"committed": true, "targets": [' + ",".join(['"x"'] * 60_000) + "]}")
    assert _recover_in_time(ws) == 0  # none of them is worked through (the huge one: over the bound)
    assert not journal.parent.exists() and {(ws / n).read_text() for n in FILES} == {"old"}


def test_a_journal_dir_that_is_a_symlink_is_never_read_or_emptied(ws: Path, tmp_path: Path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "0123456789ab.json").write_text('{"committed": true, "targets": ["a.txt"]}')
    (elsewhere / "keep.txt").write_text("keep")
    (ws / write_journal.JOURNAL).symlink_to(elsewhere)
    _recover_in_time(ws)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["0123456789ab.json", "keep.txt"]


def test_a_journal_naming_the_workspace_root_touches_nothing_beside_it(ws: Path, tmp_path: Path):
    beside = tmp_path / ".execbox-0123456789ab-0"
    beside.write_text("not the workspace's")
    (_journal_dir(ws) / "0123456789ab.json").write_text('{"committed": false, "targets": ["."]}')
    _recover_in_time(ws)
    assert beside.read_text() == "not the workspace's"


def test_an_undone_write_removes_the_directories_it_made(ws: Path):
    _die_at_rename(ws, 0, [("new1/new2/x.txt", b"new"), ("new1/y.txt", b"new")])
    write_journal.recover(str(ws))
    assert not (ws / "new1").exists() and _hidden(ws) == []


def test_writes_go_on_where_no_journal_can_be_kept_and_its_name_is_reserved(ws: Path):
    (ws / write_journal.JOURNAL).write_text("a file user code put there")
    assert writes.write_many(str(ws), [{"path": "a.txt", "content": "new"}, {"path": "sub/z.txt", "content": "z"}])
    assert (ws / "a.txt").read_text() == "new" and (ws / "sub/z.txt").read_text() == "z"
    for reserved in (write_journal.JOURNAL, f"{write_journal.JOURNAL}/0123456789ab.json"):
        with pytest.raises(fileops.FileOpError, match="execbox's own"):
            writes.write(str(ws), reserved, b"x")
    # other .execbox- names stay writable: the remote-agent providers upload .execbox-request-*.json
    assert writes.write(str(ws), "sub/.execbox-request-1.json", b"{}")["size"] == 2
