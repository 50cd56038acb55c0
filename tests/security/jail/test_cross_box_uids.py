"""Two jail boxes alive at once run as different host uids, so a process that escaped one box
(simulated here by a host process running as that box's uid, outside every namespace) can
neither signal, trace nor read the other box's processes. A positive control with the other
box's own uid shows the probe would have succeeded against a box sharing its uid."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import require
from tests.integration.jail.conftest import assert_healthy, cgroups_ready, run

pytestmark = pytest.mark.jail

PROBE = """
import ctypes, errno, json, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
out = {}
control = sys.argv[1] == "control"
for pid in map(int, sys.argv[2:]):
    r = {}
    for name, sig in (("sig0", 0), ("sigterm", signal.SIGTERM), ("sigkill", signal.SIGKILL)):
        try:
            os.kill(pid, sig)
            r[name] = "OK"
        except OSError as e:
            r[name] = errno.errorcode[e.errno]
        if control:
            break  # the positive control only sends the harmless signal 0
    if control:
        out[pid] = r
        continue
    for f in ("environ", "mem", "cwd"):
        try:
            (os.listdir if f == "cwd" else lambda p: open(p, "rb").read(1))(f"/proc/{pid}/{f}")
            r[f] = "OK"
        except OSError as e:
            r[f] = errno.errorcode[e.errno]
    rc = libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH
    r["ptrace"] = "OK" if rc == 0 else errno.errorcode[ctypes.get_errno()]
    if rc == 0:
        libc.ptrace(17, pid, None, None)   # PTRACE_DETACH
    out[pid] = r
print(json.dumps(out))
"""


def _probe_as(uid: int, pids: list[int], mode: str = "attack") -> dict[str, dict[str, str]]:
    def become() -> None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)

    p = subprocess.run(["/usr/bin/python3", "-I", "-c", PROBE, mode, *map(str, pids)], preexec_fn=become,
                       capture_output=True, text=True, timeout=30, cwd="/", check=True)
    return json.loads(p.stdout)


def test_two_live_boxes_have_distinct_host_uids_and_cannot_touch_each_other(jail):
    cgroups_ready()
    require(os.geteuid() == 0, "root (per-box host uids need it)")
    a = jail.create_instance(session_id="uid-a")
    b = jail.create_instance(session_id="uid-b")
    try:
        box_a, box_b = jail._instances[a.instance_id].box, jail._instances[b.instance_id].box
        uid_a, uid_b = box_a.lease.uid, box_b.lease.uid
        assert uid_a != uid_b and box_a.info()["host_uid"] == uid_a
        run(jail, b.instance_id, "import subprocess; subprocess.Popen(['sleep', '600'])", context_id="bg")
        pids_b = box_b.cgroup.pids()
        assert len(pids_b) >= 3  # bwrap, the agent, its context child (and the sleep)
        for pid in pids_b:
            assert os.stat(f"/proc/{pid}").st_uid in (uid_b, 0), pid  # 0: the non-dumpable agent
            with open(f"/proc/{pid}/status") as f:
                uids_line = next(line for line in f if line.startswith("Uid:"))
            assert set(uids_line.split()[1:]) == {str(uid_b)}
        # An escaped process of box A, on the host, outside every namespace of either box:
        attack = _probe_as(uid_a, pids_b)
        for pid, r in attack.items():
            assert r == {"sig0": "EPERM", "sigterm": "EPERM", "sigkill": "EPERM", "environ": "EACCES",
                         "mem": "EACCES", "cwd": "EACCES", "ptrace": "EPERM"}, (pid, r)
        # Positive control: with box B's own uid the same probe reaches B (signal 0 only).
        control = _probe_as(uid_b, pids_b, "control")
        assert all(r["sig0"] == "OK" for r in control.values()), control
        assert_healthy(jail, b.instance_id)
        assert_healthy(jail, a.instance_id)
    finally:
        jail.destroy_instance(a.instance_id)
        jail.destroy_instance(b.instance_id)
