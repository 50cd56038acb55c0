"""On a root service the host's open-file table is at its ceiling once a jail provider starts
(boxes/host_tables.py): a box's open files are bounded by its memory cgroup, not by a host-wide
table one tenant's boxes filled for all."""

from __future__ import annotations

import os

import pytest

from execbox.boxes import host_tables
from execbox.boxes.host_tables import FILE_MAX, FILE_MAX_TARGET
from tests.integration.jail.conftest import make_provider


def _write(value: int) -> None:
    with open(FILE_MAX, "w") as f:
        f.write(str(value))


def test_a_root_jail_leaves_the_hosts_open_file_table_at_its_ceiling(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("the table is raised by a root service only")
    monkeypatch.setattr(host_tables, "_done", False)  # as in a fresh service process
    _write(2466183)  # the kernel's default on a 24 GiB host
    try:
        make_provider().shutdown()
        assert int(open(FILE_MAX).read()) == FILE_MAX_TARGET
    finally:
        _write(FILE_MAX_TARGET)
