"""Pseudo-terminals in a Docker box. Under runc, as root, each box has a devpts instance of its own,
capped at PTYS_PER_BOX (boxes/devpts.py), mounted in its host dir and bound over the container's
/dev/pts (boxes/docker_host.py); the attack it stops is test_pty_exhaustion.py. Ptys work as they
did with runc's own instance (the box's uid owns its slaves), and the mount goes with the box: on
destroy, on a failed start and when a dead service's leftovers are swept. runsc boxes keep the
sentry's own devpts, which draws on no host pty."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from execbox.boxes import devpts, docker_host
from execbox.boxes.docker_box import ContainerSpec
from execbox.errors import InstanceCreationError
from execbox.providers.docker import DockerProvider
from tests.conftest import require, wait_process_exit
from tests.pty_probes import PTYS

pytestmark = pytest.mark.docker



def _capped() -> bool:
    return os.geteuid() == 0  # the service mounts the box's instance as root only


def _mounts_under(path: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(path.rstrip("/") + "/")]


def _gone(path: str, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not os.path.exists(path) and not _mounts_under(path):
            return True
        time.sleep(0.1)
    return False


def test_ptys_work_in_a_box_on_its_own_capped_instance(provider, instance):
    r = provider.execute_code(instance, PTYS, "python")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["slave"][:2] == ["/dev/pts", out["uid"]], out  # the box user's own slave
    assert out["read"] == "through-the-pty" and out["fork"] == "child-tty True", out
    if provider.runtime == "runc":
        assert out["slave"][3] == "0o620", out  # mode=620, as runc's own instance had it
        assert out["ptmx"] == "pts/ptmx" and len(out["pts"]) == 1, out  # Docker's default devpts is replaced
        capped = f"max={devpts.PTYS_PER_BOX}" in out["pts"][0].split(",")
        assert capped == _capped(), out
        box = provider._instances[instance].box
        assert box.host.pts == (devpts.path(box.host.host_dir) if _capped() else None)


def test_a_pty_process_has_a_terminal_and_takes_resizes(provider, instance):
    """The agent's pty relay (E2B ``pty.create``) on the box's devpts. Under gVisor the master
    never reads EIO once the command is gone: the relay ends on the command's exit once the pty
    is quiet (agent/pty_relay.py); before, a pty process there never reported its exit. The runsc
    box is the suite's preloaded one at 512m (at 256m the relay's fork could be OOM-killed: that is
    why gVisor boxes below 512m preload nothing, providers/preload.py)."""
    _pty_round_trip(provider, instance)


def _pty_round_trip(provider, instance) -> None:
    pid = provider.start_process(instance, "stty size; tty; read line; stty size; echo got:$line; exit 4",
                                 pty=(100, 30))
    provider.resize_process(instance, pid, 120, 40)
    provider.process_input(instance, pid, b"typed\n")
    out, err, v = wait_process_exit(provider, instance, pid, timeout=60)
    lines = out.replace(b"\r\n", b"\n").decode().splitlines()
    assert err == b"" and v["exit_code"] == 4, (out, err, v)
    assert any(line.startswith("/dev/pts/") for line in lines), lines
    assert lines[-2:] == ["40 120", "got:typed"], lines


def test_the_devpts_mount_goes_with_the_box(provider):
    require(_capped(), "root (the per-box devpts is mounted by the service as root)")
    inst = provider.create_instance(tenant_id="t", session_id="pts-destroy")
    box = provider._instances[inst.instance_id].box
    host_dir = box.host.host_dir
    if provider.runtime == "runc":
        assert box.host.pts == devpts.path(host_dir) and box.host.pts in _mounts_under(host_dir)
        binds = {m["Destination"]: m["Source"] for m in
                 provider.docker.api.inspect_container(box.container_id)["Mounts"]}
        assert binds["/dev/pts"] == box.host.pts
    else:  # gVisor: the sentry's own devpts, nothing of the host's
        assert box.host.pts is None and not os.path.exists(devpts.path(host_dir))
    provider.destroy_instance(inst.instance_id)
    assert _gone(host_dir), _mounts_under(host_dir)


def test_a_failed_start_leaves_no_devpts_mount(docker_engine, monkeypatch):
    require(_capped(), "root (the per-box devpts is mounted by the service as root)")
    require("runc" in (docker_engine.info().get("Runtimes") or {}), "docker runtime runc")
    seen: list[str] = []

    def refused(self, api_version):
        seen.append(self.pts_host or "")
        raise RuntimeError("engine refused the create (test)")

    p = DockerProvider()
    p.initialize({"runtime": "runc", "pool_size": 0, "preload": "none"})
    try:
        monkeypatch.setattr(ContainerSpec, "create_args", refused)  # after the host side is prepared
        with pytest.raises(InstanceCreationError):
            p.create_instance(tenant_id="t", session_id="pts-failed")
    finally:
        p.shutdown()
    assert len(seen) == 1 and seen[0].endswith("/pts"), seen  # it was mounted, and bound
    assert _gone(os.path.dirname(seen[0]), timeout=10), _mounts_under(os.path.dirname(seen[0]))


LEAVE_A_BOX = """
import json, os, sys
from execbox.providers.docker import DockerProvider
p = DockerProvider()
p.initialize({"runtime": "runc", "pool_size": 0, "preload": "none", "max_memory": "256m"})
inst = p.create_instance(tenant_id="t", session_id="left-by-the-dead")
box = p._instances[inst.instance_id].box
print(json.dumps({"host_dir": box.host.host_dir, "pts": box.host.pts, "container": box.container_id}), flush=True)
os._exit(0)  # dies without destroying anything: its container, mounts and host dir stay
"""


def test_a_dead_service_s_devpts_mount_is_swept(docker_engine):
    """A service that died with a runc box left its container and host dir, the devpts mounted in
    it; the next service removes the container (remove_stale) and undoes the dir (sweep)."""
    require(_capped(), "root (the per-box devpts is mounted by the service as root)")
    require("runc" in (docker_engine.info().get("Runtimes") or {}), "docker runtime runc")
    out = subprocess.run([sys.executable, "-c", LEAVE_A_BOX], capture_output=True, text=True, timeout=180,  # noqa: S603
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr[-3000:]
    left = json.loads(out.stdout.strip().splitlines()[-1])
    host_dir = left["host_dir"]
    try:
        assert left["pts"] == devpts.path(host_dir) and left["pts"] in _mounts_under(host_dir)
        assert docker_engine.containers.get(left["container"]).status == "running"
        p = DockerProvider()
        p.initialize({"runtime": "runc", "pool_size": 0, "preload": "none"})  # sweeps at start
        p.shutdown()
        assert _mounts_under(host_dir) == [] and not os.path.exists(host_dir)
    finally:
        try:
            docker_engine.api.remove_container(left["container"], force=True)
        except Exception:  # noqa: BLE001 - removed by the sweep already
            pass
        docker_host.undo(host_dir)
