"""On a root service the host's open-file table is at its ceiling once a jail provider starts
(boxes/host_tables.py): a box's open files are bounded by its memory cgroup, not by a host-wide
table one tenant's boxes filled for all."""

from __future__ import annotations

import os

import pytest

from execbox.boxes.host_tables import FILE_MAX_TARGET
from tests.integration.jail.conftest import make_provider


def test_a_root_jail_leaves_the_hosts_open_file_table_at_its_ceiling():
    if os.geteuid() != 0:
        pytest.skip("the table is raised by a root service only")
    make_provider().shutdown()
    assert int(open("/proc/sys/fs/file-max").read()) == FILE_MAX_TARGET
