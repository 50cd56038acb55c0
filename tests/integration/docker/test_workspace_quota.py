"""A Docker box's /workspace has the jail's size limit (``disk_quota_mb``): before, a box filled the
host's disk under /var/lib/docker/volumes. Writing past it fails with ENOSPC inside the box, for a
pool box's own workspace and for a session's directory alike, under runc and runsc."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from execbox.boxes import docker_host, quota
from execbox.errors import ProviderUnavailableError
from execbox.providers.docker import DockerProvider
from tests.conftest import require
from tests.integration.docker.conftest import runtimes_of

pytestmark = pytest.mark.docker

QUOTA_MB = 16
FILL = ("import errno, os\n"
        "st = os.statvfs('/workspace')\n"
        "written, err = 0, None\n"
        "for i in range(64):\n"
        "    try:\n"
        "        with open(f'fill{i}', 'wb') as f:\n"
        "            f.write(b'x' * (1 << 20))\n"
        "        written += 1\n"
        "    except OSError as e:\n"
        "        err = errno.errorcode[e.errno]\n"
        "        break\n"
        "print(st.f_blocks * st.f_frsize >> 20, written, err)")


@pytest.fixture(scope="module", params=["runc", "runsc"])
def small(request, docker_engine):
    require(request.param in runtimes_of(docker_engine), f"docker runtime {request.param}")
    p = DockerProvider()
    p.initialize({"runtime": request.param, "pool_size": 0, "preload": "none", "max_memory": "256m",
                  "disk_quota_mb": QUOTA_MB})
    yield p
    p.shutdown()


def _fill(provider, inst: str) -> tuple[int, int, str]:
    r = provider.execute_code(inst, FILL, "python", timeout=60)
    assert r.exit_code == 0, r.stderr
    size, written, err = r.stdout.split()
    return int(size), int(written), err


@pytest.mark.parametrize("session_dir", [False, True], ids=["box-workspace", "session-workspace"])
def test_writing_past_the_quota_is_enospc_in_the_box(small, tmp_path, session_dir):
    ws = str(tmp_path / "ws") if session_dir else None
    inst = small.create_instance(tenant_id="t", session_id="fill", workspace=ws).instance_id
    try:
        size, written, err = _fill(small, inst)
        assert size <= QUOTA_MB and err == "ENOSPC" and written < QUOTA_MB
        assert small.applied_limits()["disk_quota_mb"] == QUOTA_MB
        if session_dir:
            assert os.path.exists(os.path.join(ws, "fill0"))  # the host sees the files in place
    finally:
        small.destroy_instance(inst)
    if session_dir and os.geteuid() == 0:  # they live in the session's own image, kept with it
        deadline = time.monotonic() + 60
        while quota.is_mounted(ws) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.path.getsize(os.path.join(ws, quota.PERSISTENT_IMAGE)) == QUOTA_MB << 20


def test_a_workspace_its_previous_box_still_holds_is_sb009_with_retry_after(small, tmp_path):
    """Review 52, F1: a session's new box waited the jail's 30 s for the loop device of its
    workspace image (a previous box's, released lazily once its last process is gone: a runsc
    gofer, a live-restored container) and then failed SB004 "no capacity". Now it waits
    ``docker_host.HELD_WAIT`` and answers SB009 ``previous_owner_holds_workspace`` with Retry-After,
    as docs/sessions.md says; once the image is free the session starts with its files."""
    require(os.geteuid() == 0 and quota.loop_quota_possible()[0], "root with loop devices")
    ws = str(tmp_path / "held")
    inst = small.create_instance(tenant_id="t", session_id="held", workspace=ws).instance_id
    small.write_file(inst, "kept.txt", "kept")
    small.destroy_instance(inst)
    image = os.path.join(ws, quota.PERSISTENT_IMAGE)
    deadline = time.monotonic() + 60
    while (quota.is_mounted(ws) or quota.loop_devices(image)) and time.monotonic() < deadline:
        time.sleep(0.05)
    held = subprocess.run(["losetup", "--find", "--show", "--read-only", image], capture_output=True,  # noqa: S607
                          text=True, check=True).stdout.strip()  # as a box's lingering loop device
    try:
        t0 = time.monotonic()
        with pytest.raises(ProviderUnavailableError) as ei:
            small.create_instance(tenant_id="t", session_id="held", workspace=ws)
        took = time.monotonic() - t0
    finally:
        subprocess.run(["losetup", "-d", held], check=False)  # noqa: S603,S607
    assert ei.value.details["reason"] == "previous_owner_holds_workspace"
    assert getattr(ei.value, "retry_after", None) == 1
    assert docker_host.HELD_WAIT - 1 < took < docker_host.HELD_WAIT + 10
    inst = small.create_instance(tenant_id="t", session_id="held", workspace=ws).instance_id
    try:
        assert small.execute_code(inst, "print(open('kept.txt').read())", "python").stdout == "kept\n"
    finally:
        small.destroy_instance(inst)
