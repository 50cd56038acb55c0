"""A Docker box's /workspace has the jail's size limit (``disk_quota_mb``): before, a box filled the
host's disk under /var/lib/docker/volumes. Writing past it fails with ENOSPC inside the box, for a
pool box's own workspace and for a session's directory alike, under runc and runsc."""

from __future__ import annotations

import os
import time

import pytest

from execbox.boxes import quota
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
