"""The shared attack battery (tests/security/battery.py) against Docker boxes, runc and runsc.

User code runs as the box's own host uid (boxes/docker_uid.py) while the agent keeps real uid 0
(agent/privsep.py), and the boxes'
seccomp profile (boxes/oci_seccomp.py) is enforced by runc in the kernel and by gVisor in its
sentry (runtime registered with --oci-seccomp). Under runsc user code also has a PID namespace
of its own (agent/pidns.py): the battery then finds no process of the agent's at all."""

from __future__ import annotations

import pytest

from tests.security.battery import assert_agent_unharmed, assert_contained, run_battery

pytestmark = pytest.mark.docker


def test_user_code_cannot_reach_the_agent_or_the_kernel_surface(provider, instance):
    box = provider._instances[instance].box
    assert box.hello["privsep"] == "uid"
    assert box.hello["pid_ns"] is (provider.runtime != "runc")  # gVisor: user code's own PID namespace
    out = run_battery(provider, instance)
    assert_contained(out, signals_refused=True, proc_access_checked=provider.runtime == "runc")
    uid = box.host.uid
    assert out["uid"] == [uid, uid] and out["agent_uids"][0] == "0"
    assert_agent_unharmed(provider, instance, out["agent_pid"])


def test_files_the_agent_writes_belong_to_the_sandbox_user(provider, instance):
    uid = provider._instances[instance].box.host.uid
    provider.write_file(instance, "from-host.txt", "hi")
    r = provider.execute_code(instance, "import os; s = os.stat('from-host.txt'); print(s.st_uid, s.st_gid);"
                              "open('from-host.txt', 'a').write(' there'); print(open('from-host.txt').read())",
                              "python", 20)
    assert r.stdout.split("\n")[:2] == [f"{uid} {uid}", "hi there"], (r.stdout, r.stderr)
