"""Docker GPU opt-in without a GPU: the device requests a box would get for a fake device list,
and the SB errors at session creation (no GPU, runsc without nvproxy, tenant cap). Starting a
real GPU container needs an NVIDIA host: scripts/verify_gpu.sh, recorded in docs/gpu.md."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from execbox.errors import InvalidConfigError, RateLimitError
from execbox.providers.docker import DockerProvider
from tests.conftest import require

from .conftest import runtimes_of

pytestmark = pytest.mark.docker


@pytest.fixture
def fake_dev(monkeypatch):
    d = tempfile.mkdtemp(prefix="execbox-fakedev-")
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        open(os.path.join(d, name), "w").close()
    monkeypatch.setenv("EXECBOX_GPU_DEV_ROOT", d)
    yield d
    shutil.rmtree(d)


def _provider(**cfg):
    p = DockerProvider()
    p.initialize({"runtime": "runc", "pool_size": 0, **cfg})
    return p


def test_selected_indices_become_device_ids(docker_engine, fake_dev):
    p = _provider(gpu="1,0")
    try:
        (req,) = p.container_spec().create_kwargs()["device_requests"]
        assert req["DeviceIDs"] == ["0", "1"] and req["Capabilities"] == [["gpu"]] and not req.get("Count")
        assert p.applied_limits()["gpu"] == "0,1 -> 0,1"
    finally:
        p.shutdown()
    q = _provider()  # off by default: no device request at all
    try:
        assert "device_requests" not in q.container_spec().create_kwargs()
    finally:
        q.shutdown()


def test_gpu_where_the_host_has_none_is_sb002_at_session_creation(docker_engine, tmp_path, monkeypatch):
    monkeypatch.setenv("EXECBOX_GPU_DEV_ROOT", str(tmp_path))
    p = _provider(gpu="all", pool_size=2)
    try:
        assert any("no NVIDIA GPU" in w for w in p.warnings())
        assert p._pool is None  # no warm pool of containers that could not get their GPUs
        with pytest.raises(InvalidConfigError) as e:
            p.create_instance(tenant_id="acme")
        assert e.value.code == "SB002" and e.value.details["missing"] == "NVIDIA device"
        assert not p._instances
    finally:
        p.shutdown()


def test_an_index_the_host_lacks_is_sb002(docker_engine, fake_dev):
    p = _provider(gpu="0,5")
    try:
        with pytest.raises(InvalidConfigError) as e:
            p.create_instance()
        assert e.value.details["missing"] == [5] and e.value.details["available"] == [0, 1]
    finally:
        p.shutdown()


def test_runsc_without_nvproxy_is_sb002_naming_the_flag(docker_engine, fake_dev):
    require("runsc" in runtimes_of(docker_engine), "docker runtime runsc")
    p = DockerProvider()
    p.initialize({"runtime": "runsc", "pool_size": 0, "gpu": "all"})
    try:
        with pytest.raises(InvalidConfigError) as e:
            p.create_instance()
        assert e.value.details["missing"] == "--nvproxy" and "nvproxy" in e.value.message
    finally:
        p.shutdown()


def test_tenant_cap_is_sb008_before_any_container_starts(docker_engine, fake_dev):
    p = _provider(gpu="0", gpu_tenant_cap="acme=0")
    try:
        with pytest.raises(RateLimitError) as e:
            p.create_instance(tenant_id="acme", session_id="s")
        assert e.value.code == "SB008" and e.value.details["cap"] == 0
        assert not p._instances
    finally:
        p.shutdown()


def test_stored_boolean_gpu_still_means_all(docker_engine, fake_dev):
    p = _provider(gpu=True)
    try:
        (req,) = p.container_spec().create_kwargs()["device_requests"]
        assert req["Count"] == -1
    finally:
        p.shutdown()
