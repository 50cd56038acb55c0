"""Every devpts instance counts against one host-wide limit (kernel.pty.max, less kernel.pty.reserve
for the host's own). runc gave each container an instance without a cap: one tenant's runc box
opened all 3071 ptys the host had left, and then other tenants' runc boxes (``os.openpty``, E2B
``pty.create``) and even the operator's ``docker run -t`` got none until that box was destroyed.
As root each runc box now has an instance of its own capped at PTYS_PER_BOX (boxes/devpts.py,
boxes/docker_host.py): the attacker gets that many, everyone else still gets theirs. A runsc box's
ptys are the sentry's: they never count on the host.

The hog stops of its own accord at eight times the cap, so even without the cap this test never
takes the host's last pty (it fails on the count instead)."""

from __future__ import annotations

import json
import os
import time

import pytest

from execbox.boxes import devpts
from tests.conftest import require, wait_process_exit
from tests.pty_probes import VICTIM, pty_nr

pytestmark = pytest.mark.docker


# Held by a context's processes after the run returns: four processes open ptys until refused or
# they hold twice the cap each (512 in all at most), so the cap that stops them is the box's.
HOG = """
import errno, json, os, time
EACH = %d
held = []
def grab(n):
    try:
        while len(held) < n:
            held.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
    except OSError as e:
        return len(held), errno.errorcode.get(e.errno, str(e.errno))
    return len(held), "stopped"
r, w = os.pipe()
for _ in range(3):
    if os.fork() == 0:
        os.write(w, (json.dumps(grab(EACH)) + "\\n").encode())
        time.sleep(600)
        os._exit(0)
lines = b""
while lines.count(b"\\n") < 3:
    lines += os.read(r, 4096)
got = [json.loads(line) for line in lines.decode().splitlines()] + [list(grab(EACH))]
print(json.dumps(got))
"""

# runsc: one process (the context) holds them; each of the sentry's ptys takes some of the box's
# memory (and a forking context of a preloaded runsc box at 256m is OOM-killed, ptys or not).
GVISOR_HOG = """
import os
held = [os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY) for _ in range(%d)]
print(len(held))
"""



def _wait(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


def test_one_box_cannot_take_every_pty_on_the_host(provider):
    require(os.geteuid() == 0, "root (the per-box devpts cap is mounted by the service as root)")
    baseline = pty_nr()
    attacker = provider.create_instance(tenant_id="tenant-a", session_id="pty-hog").instance_id
    victim = provider.create_instance(tenant_id="tenant-b", session_id="pty-victim").instance_id
    try:
        if provider.runtime == "runc":
            r = provider.execute_code(attacker, HOG % (2 * devpts.PTYS_PER_BOX), "python", timeout=60,
                                      context_id="hog")
            assert r.exit_code == 0, r.stderr
            got = json.loads(r.stdout)
            during = pty_nr()
            assert [e for _, e in got] == ["ENOSPC"] * 4, got  # refused by the box's cap, in every process
            assert sum(n for n, _ in got) == devpts.PTYS_PER_BOX, got  # the box's cap, not a process's
            assert during >= baseline + devpts.PTYS_PER_BOX  # held now, host-wide
        else:  # gVisor: the sentry's own ptys, none of the host's
            held = devpts.PTYS_PER_BOX // 2
            r = provider.execute_code(attacker, GVISOR_HOG % held, "python", timeout=60, context_id="hog")
            assert r.exit_code == 0 and r.stdout.strip() == str(held), r.stderr
            during = pty_nr()
            assert during < baseline + held, (baseline, during)  # not one of them is the host's

        r = provider.execute_code(victim, VICTIM, "python")  # another tenant, meanwhile
        assert r.exit_code == 0 and r.stdout.split()[1:] == ["victim-ok"], (r.stdout, r.stderr)
        if provider.runtime == "runc":  # (runsc: a pty process's exit is never seen, test_ptys.py)
            pid = provider.start_process(victim, "tty; echo from-the-pty", pty=(80, 24))  # E2B pty.create
            out, _, v = wait_process_exit(provider, victim, pid, timeout=60)
            assert v["exit_code"] == 0 and b"/dev/pts/" in out and b"from-the-pty" in out, (out, v)
    finally:
        provider.destroy_instance(attacker)
        provider.destroy_instance(victim)
    assert _wait(lambda: pty_nr() <= baseline, timeout=60), (baseline, pty_nr())  # given back with the box
