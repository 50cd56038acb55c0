"""On a root service the host's open-file and pty tables are raised once a jail provider starts
(boxes/host_tables.py): a box's open files are bounded by its memory cgroup, not by a host-wide
table one tenant's boxes filled for all, and boxes at their pty cap leave the host's reserve."""

from __future__ import annotations

import os

import pytest

from execbox.boxes import host_tables
from execbox.boxes.host_tables import FILE_MAX, FILE_MAX_TARGET, PTY_MAX, pty_max_target
from execbox.boxes.uids import configured_range
from tests.integration.jail.conftest import cgroups_ready, make_provider


def _write(value: int, path: str = FILE_MAX) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def test_a_root_jail_raises_the_hosts_open_file_and_pty_tables(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("the table is raised by a root service only")
    cgroups_ready()  # ... whose boxes have memory cgroups, the bound the tables give way to
    monkeypatch.setattr(host_tables, "_done", False)  # as in a fresh service process
    before = int(open(FILE_MAX).read()), int(open(PTY_MAX).read())
    target = pty_max_target(configured_range().count)
    try:
        _write(2466183)  # the kernel's defaults (file-max: on a 24 GiB host)
        _write(max(4096, int(open("/proc/sys/kernel/pty/nr").read()) + 64), PTY_MAX)  # never below what is open
        make_provider().shutdown()
        assert int(open(FILE_MAX).read()) == FILE_MAX_TARGET
        assert int(open(PTY_MAX).read()) == target > 4096
    finally:  # the host's own values where they were higher
        _write(max(before[0], FILE_MAX_TARGET))
        _write(max(before[1], target), PTY_MAX)
