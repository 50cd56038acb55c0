"""Every Docker box runs as a host uid of its own (boxes/docker_uid.py), leased from the jail's
range while its container lives. Before, user code, spares and contexts of every box were host
uid 1000, a login account on many hosts: such a process read and wrote other tenants' workspaces
through /proc/<pid>/root, and one box could exhaust that uid's inotify instances for all."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from execbox.boxes import quota, uids
from execbox.boxes.docker_owner import REGISTRY_LABEL
from execbox.errors import RateLimitError
from execbox.providers.docker import DockerProvider
from tests.conftest import require

pytestmark = pytest.mark.docker

WHO = ("import getpass, os, pwd, subprocess\n"
       "print(os.getuid(), os.getgid(), getpass.getuser(), os.environ['HOME'], os.stat('/workspace').st_uid,\n"
       "      subprocess.run(['whoami'], capture_output=True, text=True).stdout.strip())")
NODE_WHO = "const os = require('os'); console.log(os.userInfo().username, os.userInfo().uid)"


def _root() -> None:
    require(os.geteuid() == 0, "root (per-box uids need it; otherwise boxes run as uid 1000)")


def _released(uid: int, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lease = uids.try_acquire(uid)
        if lease is not None:
            lease.release()
            if uid not in uids.pinned():
                return True
        time.sleep(0.1)
    return False


def test_each_box_has_its_own_leased_uid_with_a_name(provider):
    _root()
    a = provider.create_instance(tenant_id="ta", session_id="sa").instance_id
    b = provider.create_instance(tenant_id="tb", session_id="sb").instance_id
    seen = []
    try:
        for inst in (a, b):
            r = provider.execute_code(inst, WHO, "python")
            assert r.exit_code == 0, r.stderr
            uid, gid, name, home, ws_owner, whoami = r.stdout.split()
            assert uid == gid == ws_owner and (name, whoami, home) == ("sandbox", "sandbox", "/workspace")
            provider.write_file(inst, "who.js", NODE_WHO)
            r = provider.execute_code(inst, "node who.js", "bash")
            assert r.stdout.split() == ["sandbox", uid], r.stderr
            seen.append(int(uid))
        assert seen[0] != seen[1] and 1000 not in seen
        assert all(u in uids.configured_range() for u in seen)
        assert not uids.users_in_range(uids.UidRange(seen[0], 1)) and not uids.users_in_range(uids.UidRange(seen[1], 1))
        for u in seen:  # held while the container lives, by this process, and pinned beyond it
            assert uids.try_acquire(u) is None and u in uids.pinned()
    finally:
        provider.destroy_instance(a)
        provider.destroy_instance(b)
    assert all(_released(u) for u in seen)  # given back once the container is gone


def test_a_host_account_of_uid_1000_cannot_reach_a_box(provider, docker_engine):
    """The reviewer's attack: a plain host process of uid 1000 read a box's workspace and environ
    through /proc/<pid>/root; now no process of the box has that uid, so every path is refused."""
    _root()  # under runsc the host sees only gVisor's own processes: the same attack finds nothing either
    require(shutil.which("setpriv") is not None, "setpriv (util-linux)")
    inst = provider.create_instance(tenant_id="victim", session_id="s").instance_id
    try:
        provider.write_file(inst, "secret.txt", "TENANT-SECRET-42")
        r = provider.execute_code(inst, "X = 'in-memory'\nprint(1)", "python", context_id="c1")
        assert r.exit_code == 0, r.stderr
        box = provider._instances[inst].box
        pids = [int(row[1]) for row in docker_engine.api.top(box.container_id, ps_args="-eo user,pid")["Processes"]]
        probe = ("import sys\nhits = []\n"
                 "for pid in sys.argv[1:]:\n"
                 "    for path in (f'/proc/{pid}/root/workspace/secret.txt', f'/proc/{pid}/environ'):\n"
                 "        try:\n            open(path, 'rb').read(); hits.append(path)\n"
                 "        except OSError:\n            pass\n"
                 "print(hits)")
        out = subprocess.run(["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups",  # noqa: S603,S607
                              sys_python(), "-c", probe, *map(str, pids)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert len(pids) >= (3 if provider.runtime == "runc" else 1) and out.stdout.strip() == "[]"
    finally:
        provider.destroy_instance(inst)


def sys_python() -> str:
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else shutil.which("python3") or "python3"


HOG = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nFDS = []\n"
       "while len(FDS) < 100000:\n    fd = libc.inotify_init()\n    if fd < 0:\n        break\n    FDS.append(fd)\n"
       "print(len(FDS))")
PROBE = "import ctypes\nprint(ctypes.CDLL(None).inotify_init() >= 0)"


def test_one_box_holding_every_inotify_instance_leaves_other_boxes_theirs(provider):
    """fs.inotify.max_user_instances counts per host uid: with one shared uid a tenant starved all.
    (gVisor keeps its own inotify limits per sandbox: there the hog hits only its open-file limit.)"""
    _root()
    hog = provider.create_instance(tenant_id="attacker", session_id="a").instance_id
    victim = provider.create_instance(tenant_id="victim", session_id="b").instance_id
    try:
        r = provider.execute_code(hog, HOG, "python", context_id="hog")  # a context keeps them open
        assert r.exit_code == 0 and int(r.stdout) > 0, r.stderr
        if provider.runtime == "runc":  # the host's per-uid limit was hit (gVisor: only the hog's nofile)
            assert provider.execute_code(hog, PROBE, "python").stdout.strip() == "False"
        assert provider.execute_code(victim, PROBE, "python").stdout.strip() == "True"
    finally:
        provider.destroy_instance(hog)
        provider.destroy_instance(victim)


def test_a_session_workspace_is_reowned_for_the_next_box(provider, tmp_path):
    _root()
    ws = str(tmp_path / "ws")
    first = provider.create_instance(tenant_id="t", session_id="reown", workspace=ws).instance_id
    try:
        r = provider.execute_code(first, "import os\nos.makedirs('d')\nopen('d/f', 'w').write('1')\n"
                                  "print(os.getuid())", "python")
        assert r.exit_code == 0, r.stderr
        uid1 = int(r.stdout)
    finally:
        provider.destroy_instance(first)
    second = provider.create_instance(tenant_id="t", session_id="reown", workspace=ws).instance_id
    try:
        r = provider.execute_code(second, "import os\nopen('d/f', 'a').write('2')\nopen('d/g', 'w').write('3')\n"
                                  "print(os.getuid(), os.stat('d').st_uid, os.stat('d/f').st_uid, open('d/f').read())",
                                  "python")
        assert r.exit_code == 0, r.stderr
        uid2, d_owner, f_owner, content = r.stdout.split()
        assert int(uid2) != uid1 and uid2 == d_owner == f_owner and content == "12"
    finally:
        provider.destroy_instance(second)


def test_a_kept_session_box_keeps_its_uid_through_a_restart(docker_engine, tmp_path):
    """A session container outlives the process that started it: its uid stays pinned (no other box
    gets it meanwhile), the next process takes the lease over when it re-attaches, and gives it
    back only once the container is removed."""
    _root()
    ws = str(tmp_path / "ws")
    cfg = {"runtime": "runc", "pool_size": 0, "preload": "none", "max_memory": "256m"}
    first = DockerProvider()
    first.initialize(cfg)
    try:
        inst = first.create_instance(tenant_id="t", session_id="kept", workspace=ws,
                                     labels={REGISTRY_LABEL: str(tmp_path)})
        box = first._instances[inst.instance_id].box
        uid, container = box.host.uid, box.container_id
        assert first.execute_code(inst.instance_id, "x = 41", "python", context_id="c").exit_code == 0
        assert first.detach_instance(inst.instance_id)
    finally:
        first.shutdown()
    second = None
    try:
        assert docker_engine.containers.get(container).status == "running"
        lease = uids.try_acquire(uid)
        assert lease is not None  # nobody holds its lock while no service runs...
        lease.release()
        with pytest.raises(RateLimitError):  # ...but it is never handed to another box
            uids.acquire(uids.UidRange(uid, 1))
        second = DockerProvider()
        second.initialize(cfg)
        adopted = second.adopt_instance({"container_id": container, "instance_id": inst.instance_id},
                                        tenant_id="t", session_id="kept", workspace=ws)
        assert adopted is not None
        r = second.execute_code(adopted.instance_id, "import os\nprint(x + 1, os.getuid())", "python", context_id="c")
        assert r.stdout.split() == ["42", str(uid)], r.stderr
        assert uids.try_acquire(uid) is None  # the new process holds it now
        second.destroy_instance(adopted.instance_id)
        assert _released(uid)
        assert not quota.is_mounted(ws)
    finally:
        if second is not None:
            second.shutdown()
        try:
            docker_engine.api.remove_container(container, force=True)
        except Exception:  # noqa: BLE001 - removed by the test already
            pass
