"""Every devpts instance counts against one host-wide limit (kernel.pty.max, less kernel.pty.reserve
for the host). Code in one box opened ptys until the kernel refused (six processes took all 3071)
and then no other tenant's box could open one, `pty.create` included, until that box was
destroyed. As root each box has a devpts instance of its own capped at PTYS_PER_BOX
(boxes/devpts.py): the attacker gets that many, everyone else still gets theirs."""

from __future__ import annotations

import json
import os

import pytest

from execbox.boxes import devpts
from execbox.boxes.jail_box import drain
from tests.conftest import require, wait_process_exit
from tests.integration.jail.conftest import assert_healthy, run, wait_for
from tests.pty_probes import VICTIM, pty_nr

pytestmark = pytest.mark.jail


# Held by a context's process (and its children) after the run returns: every process opens ptys
# until the kernel refuses, so a cap per process (nofile) would not be what stops them.
HOG = """
import errno, json, os, time
held = []
def grab():
    try:
        while True:
            held.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
    except OSError as e:
        return len(held), errno.errorcode.get(e.errno, str(e.errno))
r, w = os.pipe()
for _ in range(3):
    if os.fork() == 0:
        os.write(w, (json.dumps(grab()) + "\\n").encode())
        time.sleep(600)
        os._exit(0)
lines = b""
while lines.count(b"\\n") < 3:
    lines += os.read(r, 4096)
got = [json.loads(line) for line in lines.decode().splitlines()] + [list(grab())]
print(json.dumps(got))
"""



def test_one_box_cannot_take_every_pty_on_the_host(jail):
    require(os.geteuid() == 0, "root (the per-box devpts cap is mounted by the service as root)")
    baseline = pty_nr()
    attacker = jail.create_instance(tenant_id="tenant-a", session_id="pty-hog")
    victim = jail.create_instance(tenant_id="tenant-b", session_id="pty-victim")
    try:
        r = run(jail, attacker.instance_id, HOG, context_id="hog", timeout=30)
        got = json.loads(r.stdout)
        assert [e for _, e in got] == ["ENOSPC"] * 4, r  # refused by the box's cap, in every process
        assert sum(n for n, _ in got) == devpts.PTYS_PER_BOX  # the cap is the box's, not a process's
        assert pty_nr() >= baseline + devpts.PTYS_PER_BOX  # held now, host-wide

        r = run(jail, victim.instance_id, VICTIM)  # another tenant, meanwhile
        assert r.exit_code == 0 and r.stdout.split()[1:] == ["victim-ok"], r
        pid = jail.start_process(victim.instance_id, "tty; echo from-the-pty", pty=(80, 24))  # E2B pty.create
        out, _, v = wait_process_exit(jail, victim.instance_id, pid)
        assert v["exit_code"] == 0 and b"/dev/pts/" in out and b"from-the-pty" in out, (out, v)
        fresh = jail.create_instance(tenant_id="tenant-c")
        try:
            r = run(jail, fresh.instance_id, VICTIM)
            assert r.exit_code == 0 and r.stdout.split()[1:] == ["victim-ok"], r
        finally:
            jail.destroy_instance(fresh.instance_id)
    finally:
        jail.destroy_instance(attacker.instance_id)
        jail.destroy_instance(victim.instance_id)
    assert drain()
    assert wait_for(lambda: pty_nr() <= baseline, timeout=10), (baseline, pty_nr())
    assert_healthy(jail)
