"""cgroup v2 paths of boxes/cgroups.py, on whatever v2 hierarchy this host has.

Hosts with cgroup v1 controllers (like the project's test machines) still mount an empty v2
hierarchy: enough to exercise joining, cgroup.kill, removal, and the clear refusal when the
controllers the jail needs are not delegated.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from execbox.boxes import cgroups
from tests.conftest import require

from .conftest import wait_for

pytestmark = pytest.mark.jail


def _v2_mount() -> str | None:
    return cgroups._mounts().get("cgroup2")


@pytest.fixture
def v2_parent():
    mount = _v2_mount()
    require(mount is not None and os.geteuid() == 0, "a cgroup2 mount and root")
    parent = os.path.join(mount, cgroups._own_paths().get("", "/").lstrip("/"), f"execbox-v2test-{os.getpid()}")
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        pytest.skip(f"cgroup2 hierarchy not writable here: {e}")
    require(os.path.exists(os.path.join(parent, "cgroup.kill")), "cgroup.kill (Linux >= 5.14)")
    yield parent
    for d in os.listdir(parent):
        if os.path.isdir(os.path.join(parent, d)):
            os.rmdir(os.path.join(parent, d))
    os.rmdir(parent)


def test_v2_kill_all_reaches_a_daemonized_process_then_removes_the_cgroup(v2_parent):
    cg = cgroups.BoxCgroup(cgroups.Layout(2, {"": v2_parent}), "box1")
    os.mkdir(cg.dirs[""])
    # a parent that joins the cgroup, then leaves a daemon behind (double fork + setsid)
    proc = subprocess.Popen(["/usr/bin/python3", "-c",
                             "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                             "    if os.fork() == 0:\n        time.sleep(300)\n    os._exit(0)\n"
                             "time.sleep(300)"], preexec_fn=cg.join)
    assert wait_for(lambda: len(cg.pids()) == 2, timeout=10)
    pids = cg.pids()
    assert cg.kill_all() == []
    proc.wait(timeout=10)
    assert wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids), timeout=10)
    assert cg.remove() and not cg.exists()
    assert cg.oom_kills() == 0  # no memory.events without the memory controller: counted as none


def test_v2_without_delegated_controllers_is_refused_with_the_reason(v2_parent):
    # what _prepare_v2 checks: the controllers of our own group (v2_parent, a child of it, sees
    # only those enabled for children; a real v2 host showed the two can differ)
    mount, own = _v2_mount(), cgroups._own_paths().get("", "/")
    controllers = open(os.path.join(mount, own.lstrip("/"), "cgroup.controllers")).read().split()
    if {"memory", "pids", "cpu"} <= set(controllers):
        pytest.skip("this host delegates the v2 controllers to our cgroup; nothing to refuse")
    with pytest.raises(cgroups.CgroupUnavailable) as e:
        cgroups._prepare_v2(mount, own)
    assert "not delegated" in str(e.value)
