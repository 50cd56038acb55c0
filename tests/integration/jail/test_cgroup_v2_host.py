"""The jail's limits on a real cgroup v2 host: memory (SB006 + OOM count), pids, CPU bandwidth
and kill-all, both as root and inside a delegated subtree (scripts/verify_cgroup_v2.sh runs this
file in both set-ups and records the output in docs/cgroup-v2.md).

This project's CI machine is cgroup v1: there every test here skips naming the missing piece,
and the v1 path keeps being tested by the rest of tests/integration/jail and tests/security/jail.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from execbox.boxes import cgroups
from execbox.errors import OutOfMemoryError

from .conftest import make_provider, pids_alive, run, wait_for

pytestmark = pytest.mark.jail


def _v2_layout() -> cgroups.Layout:
    try:
        layout = cgroups.detect()
    except cgroups.CgroupUnavailable as e:
        pytest.skip(f"a cgroup v2 host with memory, pids and cpu delegated (no usable cgroups here: {e})")
    if layout.version != 2:
        pytest.skip("a cgroup v2 host: this host's jail uses cgroup v1 (run scripts/verify_cgroup_v2.sh on a v2 "
                    "machine)")
    return layout


@pytest.fixture(scope="module")
def v2jail():
    layout = _v2_layout()
    print(f"\ncgroup layout: {layout.describe()} (uid {os.geteuid()}, own cgroup "
          f"{cgroups._own_paths().get('', '?')})")
    p = make_provider(cpus=0.25)
    yield p
    p.shutdown()


def _read(cg: cgroups.BoxCgroup, name: str) -> str:
    with open(os.path.join(cg.dirs[""], name)) as f:
        return f.read().strip()


def test_limits_are_written_to_the_box_cgroup(v2jail):
    inst = v2jail.create_instance()
    try:
        cg = v2jail._instances[inst.instance_id].box.cgroup
        assert cg.layout.version == 2
        assert _read(cg, "memory.max") == str(256 * 1024 * 1024)
        assert _read(cg, "pids.max") == "64"
        assert _read(cg, "cpu.max") == "25000 100000"
        procs = set(cg.pids())
        assert procs and set(procs) >= {v2jail._instances[inst.instance_id].box.proc.pid}
    finally:
        v2jail.destroy_instance(inst.instance_id)


def test_memory_bomb_is_sb006_and_counted(v2jail):
    inst = v2jail.create_instance()
    code = """
import subprocess, sys
hog = "b = bytearray(110 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(2)"
ps = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(4)]
[p.wait() for p in ps]
print("done")
"""
    try:
        box = v2jail._instances[inst.instance_id].box
        try:
            r = run(v2jail, inst.instance_id, code, timeout=60)
            assert r.metadata.get("error_code") == "SB006", (r.stdout, r.stderr[-300:])
        except OutOfMemoryError as e:  # the OOM killer picked the agent itself
            assert e.code == "SB006"
        assert box.oom_events() >= 1
    finally:
        v2jail.destroy_instance(inst.instance_id)


def test_fork_bomb_stops_at_pids_max(v2jail):
    inst = v2jail.create_instance()
    code = """
import os, time, json
n, err = 0, None
try:
    while n < 5000:
        if os.fork() == 0:
            time.sleep(30); os._exit(0)
        n += 1
except OSError as e:
    err = e.strerror
print(json.dumps({"forked": n, "error": err}))
"""
    try:
        cg = v2jail._instances[inst.instance_id].box.cgroup
        out = json.loads(run(v2jail, inst.instance_id, code, timeout=60).stdout)
        assert out["error"] == "Resource temporarily unavailable" and out["forked"] < 64
        events = dict(line.split() for line in _read(cg, "pids.events").splitlines())
        assert int(events["max"]) > 0
    finally:
        v2jail.destroy_instance(inst.instance_id)


def test_cpu_bandwidth_is_capped(v2jail):
    inst = v2jail.create_instance()
    try:
        cg = v2jail._instances[inst.instance_id].box.cgroup
        before = dict(line.split() for line in _read(cg, "cpu.stat").splitlines())
        t = time.monotonic()
        run(v2jail, inst.instance_id, "import time\nend = time.monotonic() + 2\nwhile time.monotonic() < end: pass",
            timeout=30)
        wall = time.monotonic() - t
        after = dict(line.split() for line in _read(cg, "cpu.stat").splitlines())
        used = (int(after["usage_usec"]) - int(before["usage_usec"])) / 1e6
        print(f"cpu: {used:.2f} s used in {wall:.2f} s wall at cpus=0.25; "
              f"throttled {after.get('nr_throttled')} periods")
        assert int(after["nr_throttled"]) > int(before["nr_throttled"])
        assert used < 0.5 * wall  # 0.25 CPUs (plus start-up slack), never a whole core
    finally:
        v2jail.destroy_instance(inst.instance_id)


def test_destroy_kills_a_daemon_and_removes_the_cgroup(v2jail):
    from execbox.boxes.jail_box import drain

    # A run's leftovers end with the run; a context's process outlives it, so a daemon it starts
    # in a session of its own is alive until destroy (first seen on a real v2 host: without the
    # context only bwrap and the agent were left).
    inst = v2jail.create_instance(session_id="v2-daemon")
    box = v2jail._instances[inst.instance_id].box
    code = "import subprocess; subprocess.Popen(['sleep', '977.5'], start_new_session=True); print('spawned')"
    assert run(v2jail, inst.instance_id, code, context_id="ctx").stdout == "spawned\n"
    pids = box.cgroup.pids()
    assert len(pids) >= 4  # bwrap, agent, context process, sleep
    v2jail.destroy_instance(inst.instance_id)
    assert wait_for(lambda: not pids_alive(pids), timeout=10)
    assert drain() and not box.cgroup.exists()
