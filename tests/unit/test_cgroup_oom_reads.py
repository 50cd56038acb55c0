"""The OOM counter a box's runs compare: one descriptor kept open, read fresh each time, gone with the cgroup."""

from __future__ import annotations

import os

from execbox.boxes import cgroups


def _box(tmp_path, version: int = 2) -> tuple[cgroups.BoxCgroup, str]:
    if version == 2:
        layout = cgroups.Layout(2, {"": str(tmp_path)})
        name = "memory.events"
    else:
        layout = cgroups.Layout(1, {"memory": str(tmp_path)})
        name = "memory.oom_control"
    cg = cgroups.BoxCgroup(layout, "box")
    os.mkdir(tmp_path / "box")
    return cg, str(tmp_path / "box" / name)


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:  # same inode, as the kernel's file stays one
        f.write(text)


def test_each_read_sees_the_current_count_through_one_descriptor(tmp_path):
    cg, path = _box(tmp_path)
    _write(path, "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    assert cg.oom_kills() == 0
    fd = cg._oom_fd
    _write(path, "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n")
    assert cg.oom_kills() == 2
    assert cg._oom_fd == fd  # not reopened


def test_v1_reads_memory_oom_control(tmp_path):
    cg, path = _box(tmp_path, version=1)
    _write(path, "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert cg.oom_kills() == 5


def test_after_remove_nothing_is_read_even_if_the_number_is_reused(tmp_path):
    cg, path = _box(tmp_path)
    _write(path, "oom_kill 7\n")
    assert cg.oom_kills() == 7
    old = cg._oom_fd
    os.unlink(path)
    assert cg.remove(deadline=0.1)
    other = tmp_path / "other"
    other.write_text("oom_kill 99\n")
    fd = os.open(other, os.O_RDONLY)  # the lowest free number: usually the one remove() closed
    try:
        assert cg._oom_fd != old
        assert cg.oom_kills() == 0
        assert os.read(fd, 64) == b"oom_kill 99\n"  # the descriptor remove() closed was not ours to keep
    finally:
        os.close(fd)


def test_a_missing_file_counts_zero_and_is_tried_again(tmp_path):
    cg, path = _box(tmp_path)
    assert cg.oom_kills() == 0
    _write(path, "oom_kill 1\n")
    assert cg.oom_kills() == 1
