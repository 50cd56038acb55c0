"""The OOM counter a box's runs compare (boxes/oom_counter.py through BoxCgroup): one descriptor kept
open, read fresh each time, gone with the cgroup."""

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
    fd = cg._oom._fd
    _write(path, "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n")
    assert cg.oom_kills() == 2
    assert cg._oom._fd == fd  # not reopened


def test_v1_reads_memory_oom_control(tmp_path):
    cg, path = _box(tmp_path, version=1)
    _write(path, "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert cg.oom_kills() == 5


def test_after_remove_nothing_is_read_even_if_the_number_is_reused(tmp_path):
    cg, path = _box(tmp_path)
    _write(path, "oom_kill 7\n")
    assert cg.oom_kills() == 7
    old = cg._oom._fd
    os.unlink(path)
    assert cg.remove(deadline=0.1)
    other = tmp_path / "other"
    other.write_text("oom_kill 99\n")
    fd = os.open(other, os.O_RDONLY)  # the lowest free number: usually the one remove() closed
    try:
        assert cg._oom._fd != old
        assert cg.oom_kills() == 0
        assert os.read(fd, 64) == b"oom_kill 99\n"  # the descriptor remove() closed was not ours to keep
    finally:
        os.close(fd)


def test_a_missing_file_counts_zero_and_is_tried_again(tmp_path):
    cg, path = _box(tmp_path)
    assert cg.oom_kills() == 0
    _write(path, "oom_kill 1\n")
    assert cg.oom_kills() == 1


def test_the_counter_alone_reads_none_when_absent_or_without_the_line(tmp_path):
    from execbox.boxes.oom_counter import OomCounter, parse_oom_kills

    c = OomCounter(str(tmp_path / "memory.events"))
    assert c.read() is None  # absent
    _write(str(tmp_path / "memory.events"), "oom 0\n")
    assert c.read() is None  # no oom_kill line (old v1 kernels)
    _write(str(tmp_path / "memory.events"), "oom 1\noom_kill 1\n")
    assert c.read() == 1
    c.close()
    assert c.read() is None and c.read_text() is None
    assert parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n") == 3
