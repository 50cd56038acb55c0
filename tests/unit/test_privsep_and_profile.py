"""agent/privsep.py credentials (in a throwaway root subprocess) and the OCI seccomp profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from execbox.agent import privsep
from execbox.boxes import oci_seccomp, seccomp

SCRIPT = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from execbox.agent import privsep
mode = privsep.enter_agent(privsep.RunAs(4242, 4343))
def creds():
    st = {l.split(":")[0]: l.split(":", 1)[1].split() for l in open("/proc/self/status")}
    return {"uid": st["Uid"], "gid": st["Gid"], "capeff": st["CapEff"][0], "capbnd": st["CapBnd"][0],
            "nnp": st["NoNewPrivs"][0], "groups": st["Groups"]}
out = {"mode": mode, "agent": creds()}
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    privsep.drop_user_code()
    os.write(w, json.dumps(creds()).encode())
    os._exit(0)
os.waitpid(pid, 0)
out["child"] = json.loads(os.read(r, 65536))
print(json.dumps(out))
"""


def test_agent_keeps_real_uid_zero_and_children_drop_everything():
    if os.geteuid() != 0:
        pytest.skip("root (the privilege drop starts from uid 0)")
    src = os.path.dirname(os.path.dirname(os.path.abspath(privsep.__file__)))
    p = subprocess.run([sys.executable, "-c", SCRIPT, os.path.dirname(src)], capture_output=True, text=True,
                       timeout=30, check=True, cwd="/")
    out = json.loads(p.stdout)
    assert out["mode"] == "uid"
    assert out["agent"]["uid"] == ["0", "4242", "0", "4242"] and out["agent"]["gid"] == ["0", "4343", "0", "4343"]
    assert int(out["agent"]["capeff"], 16) == 0  # effective caps went with the effective uid
    child = out["child"]
    assert child["uid"] == ["4242"] * 4 and child["gid"] == ["4343"] * 4 and child["groups"] == []
    assert int(child["capeff"], 16) == 0 and int(child["capbnd"], 16) == 0 and child["nnp"] == "1"


def test_parse_run_as():
    assert privsep.parse_run_as("") is None and privsep.parse_run_as("none") is None
    assert privsep.parse_run_as("1000:1001") == privsep.RunAs(1000, 1001)
    assert privsep.parse_run_as("1000") == privsep.RunAs(1000, 1000)
    with pytest.raises(ValueError):
        privsep.parse_run_as("0:0")


def test_oci_profile_denies_the_jails_list_and_namespace_clones():
    prof = oci_seccomp.profile("runc")
    assert prof["defaultAction"] == "SCMP_ACT_ALLOW"
    names = set(prof["syscalls"][0]["names"])
    assert set(seccomp.DENIED_SYSCALLS) <= names
    assert {"unshare", "setns", "mount", "ptrace", "keyctl", "bpf", "perf_event_open", "io_setup", "io_submit"} <= names
    assert not names & {"setuid", "setgid", "setresuid", "setresgid", "setgroups", "prctl", "clone"}
    clones = [r for r in prof["syscalls"] if r["names"] == ["clone"]]
    assert sorted(r["args"][0]["value"] for r in clones) == sorted(seccomp.CLONE_NAMESPACE_FLAGS.values())
    assert any(r["names"] == ["clone3"] and r["errnoRet"] == 38 for r in prof["syscalls"])
    gvisor = oci_seccomp.profile("runsc")
    assert not any(r["names"] == ["clone3"] for r in gvisor["syscalls"])  # gVisor: no clone3, no errnoRet
    assert json.loads(oci_seccomp.security_opt("runsc")[len("seccomp="):]) == gvisor


def test_runsc_seccomp_flag_detection():
    info = {"Runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--platform=ptrace", "--oci-seccomp"]},
                         "runsc-plain": {"path": "/usr/bin/runsc"}}}
    assert oci_seccomp.runsc_applies_seccomp(info, "runsc")
    assert not oci_seccomp.runsc_applies_seccomp(info, "runsc-plain")


def test_gvisor_profile_allows_only_the_agents_pid_namespace_calls():
    """runsc boxes: unshare and mount leave the blanket deny list for rules that refuse every
    other argument (agent/pidns.py uses exactly these); runc keeps refusing both outright."""
    from execbox.agent import pidns

    runc = oci_seccomp.profile("runc")
    assert {"unshare", "mount"} <= set(runc["syscalls"][0]["names"])
    assert not any(r["names"] in (["unshare"], ["mount"]) for r in runc["syscalls"])
    gvisor = oci_seccomp.profile("runsc")
    assert not {"unshare", "mount"} & set(gvisor["syscalls"][0]["names"])
    assert {"setns", "umount2", "pivot_root"} <= set(gvisor["syscalls"][0]["names"])
    rules = {r["names"][0]: r for r in gvisor["syscalls"] if r["names"] in (["unshare"], ["mount"])}
    assert rules["unshare"]["args"] == [{"index": 0, "value": pidns.CLONE_NEWPID, "valueTwo": 0,
                                         "op": "SCMP_CMP_NE"}]
    assert rules["mount"]["args"] == [{"index": 3, "value": pidns.PROC_MOUNT_FLAGS, "valueTwo": 0,
                                       "op": "SCMP_CMP_NE"}]
    assert all(r["action"] == "SCMP_ACT_ERRNO" for r in rules.values())


def test_pid_namespace_is_refused_where_root_is_a_shared_mount(monkeypatch):
    from execbox.agent import pidns

    monkeypatch.setattr(pidns, "_root_is_shared", lambda: True)
    with pytest.raises(OSError, match="shared mount"):
        pidns.setup()
    assert not pidns.enabled() and pidns.proc_fd is None
