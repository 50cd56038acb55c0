"""Pseudo-terminals in a jail box: as root every box has a devpts instance of its own, capped at
PTYS_PER_BOX (boxes/devpts.py, the attack is tests/security/jail/test_pty_exhaustion.py), bound on
its /dev/pts. Ptys work as they did with bwrap's own instance, and the mount goes with the box:
on destroy, on a failed start and (test_jail_crash_recovery.py) when a dead owner's box is reaped."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from execbox.boxes import devpts, jail_box
from execbox.boxes.jail_box import boxes_dir, drain
from tests.conftest import wait_process_exit
from tests.pty_probes import PTYS

from .conftest import run

pytestmark = pytest.mark.jail



def _mounts_under(path: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(path.rstrip("/") + "/")]


def test_ptys_work_in_a_box_and_the_box_has_its_own_capped_instance(jail, box):
    r = run(jail, box, PTYS)
    assert r.exit_code == 0, r
    out = json.loads(r.stdout)
    assert out["slave"] == ["/dev/pts", 1000, 1000, "0o620"]  # the box user's own slave, as with bwrap's
    assert out["read"] == "through-the-pty"
    assert out["fork"] == "child-tty True"
    if shutil.which("script"):
        assert out["script"].startswith("/dev/pts/")
    capped = f"max={devpts.PTYS_PER_BOX}" in out["pts"][-1].split(",")
    assert capped == (os.geteuid() == 0), out["pts"]  # not root: bwrap's own instance


def test_a_pty_process_in_a_box_has_a_terminal_and_takes_resizes(jail, box):
    """The agent's pty relay (E2B ``pty.create``) on the box's devpts."""
    pid = jail.start_process(box, "stty size; tty; read line; stty size; echo got:$line; exit 4", pty=(100, 30))
    jail.resize_process(box, pid, 120, 40)
    jail.process_input(box, pid, b"typed\n")
    out, err, v = wait_process_exit(jail, box, pid)
    lines = out.replace(b"\r\n", b"\n").decode().splitlines()
    assert err == b"" and v["exit_code"] == 4
    assert any(line.startswith("/dev/pts/") for line in lines), lines  # the input may echo before it
    assert lines[-2:] == ["40 120", "got:typed"], lines


def test_the_devpts_mount_goes_with_the_box(jail):
    inst = jail.create_instance(session_id="pts-destroy")
    b = jail._instances[inst.instance_id].box
    if os.geteuid() == 0:
        assert b.pts == devpts.path(b.box_dir) and devpts.path(b.box_dir) in _mounts_under(b.box_dir)
    else:
        assert b.pts is None and not os.path.exists(devpts.path(b.box_dir))
    jail.destroy_instance(inst.instance_id)
    assert drain()
    assert _mounts_under(b.box_dir) == [] and not os.path.exists(b.box_dir)


def test_a_failed_start_leaves_no_devpts_mount(jail, monkeypatch):
    def broken():
        raise OSError(5, "seccomp export failed (test)")

    monkeypatch.setattr(jail_box.seccomp, "bpf_fd", broken)  # fails after the devpts is mounted
    mounts, names = set(_mounts_under(boxes_dir())), set(os.listdir(boxes_dir()))
    with pytest.raises(Exception, match="seccomp export failed"):
        jail.create_instance()
    assert set(_mounts_under(boxes_dir())) - mounts == set()
    assert set(os.listdir(boxes_dir())) - names == set()


def test_no_other_host_account_can_open_a_box_s_ptys(jail, tmp_path):
    """The instance's ptmx is 0666: any host account that could reach it could open the box's 64
    ptys (and leave its tenant none). Only the box's own host uid and root get through ``pty``."""
    if os.geteuid() != 0:
        pytest.skip("the capped instance is mounted by a root service only")
    iid = jail.create_instance(tenant_id="t").instance_id
    b = jail._instances[iid].box
    try:
        ptmx = os.path.join(b.pts, "ptmx")
        pid = os.fork()
        if pid == 0:  # a host account of its own (not the box's uid)
            try:
                os.setgid(65534)
                os.setuid(65534)
                os.close(os.open(ptmx, os.O_RDWR | os.O_NOCTTY))
                os._exit(0)
            except PermissionError:
                os._exit(13)
            except BaseException:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 13
        r = run(jail, iid, "import os; m, s = os.openpty(); print('ok')")
        assert r.stdout == "ok\n"  # the box itself still gets its ptys through the same gate
    finally:
        jail.destroy_instance(iid)
