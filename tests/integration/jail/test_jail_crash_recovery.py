"""An execbox process that dies without destroying its boxes: the boxes die with it, and the
next provider start removes what they left on the host (cgroups, mounts, box directories)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from execbox.boxes import cgroups, devpts, quota
from execbox.boxes.jail_box import boxes_dir, reap_stale

from .conftest import cgroups_ready, jail_ready, wait_for

pytestmark = pytest.mark.jail

OWNER = r"""
import json, sys, time
from execbox.providers.jail import JailProvider
p = JailProvider(); p.initialize({"pool_size": 0, "disk_quota_mb": 16, "preload": "none"})
inst = p.create_instance(session_id="crash")  # a session's box: its workspace is an image to unmount
box = p._instances[inst.instance_id].box
p.execute_code(inst.instance_id, "import subprocess; subprocess.Popen(['sleep', '600'])", "python", 10,
               context_id="keep")
print(json.dumps({"name": box.name, "pids": box.cgroup.pids(), "ws": box.workspace}), flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_boxes_of_a_killed_owner_die_and_are_reaped():
    cgroups_ready()
    jail_ready()
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(owner.stdout.readline())
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    # --die-with-parent: the box's processes go with their owner
    assert wait_for(lambda: not any(_running(p) for p in info["pids"]), timeout=10)
    box_dir = os.path.join(boxes_dir(), info["name"])
    assert os.path.isdir(box_dir) and quota.is_mounted(info["ws"])  # left behind by the crash
    pts = devpts.path(box_dir)
    assert quota.is_mounted(pts) == (os.geteuid() == 0)  # its capped devpts instance (root only)
    assert info["name"] in reap_stale()
    assert not os.path.exists(box_dir) and not quota.is_mounted(info["ws"]) and not quota.is_mounted(pts)
    assert not cgroups.BoxCgroup(cgroups.detect(), info["name"]).exists()


@pytest.mark.parametrize("how", ["run", "exec"])
def test_a_cli_one_shot_leaves_no_box_behind(how):
    """`execbox run` and `execbox exec --json` use the process-wide provider, whose warm pool starts
    spare boxes: they are shut down at exit (their directories, mounts and cgroups went on until
    the next execbox process reaped them, two per call, with a warning each time)."""
    cgroups_ready()
    jail_ready()
    env = {**os.environ, "SANDBOX_TYPE": "jail"}
    code = "import time\ntime.sleep(2)\nprint('hi')"  # long enough for the pool to have its spares ready
    argv, stdin = (["run", "-"], code) if how == "run" else (["exec", "--json"], json.dumps({"code": code}))
    cli = subprocess.Popen([sys.executable, "-m", "execbox", *argv], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = cli.communicate(stdin, timeout=120)
    assert cli.returncode == 0 and "hi" in out, err
    left = [n for n in os.listdir(boxes_dir()) if n.startswith(f"jail-{cli.pid}-")]
    assert left == [] and "Traceback" not in err, (left, err)
