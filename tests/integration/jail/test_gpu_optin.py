"""GPU opt-in without a GPU: config checks, the SB errors at session creation, the exact binds a
jail box gets (against a fake device directory whose "nodes" are plain files, so a real box can
start with them), and that a box without the opt-in sees no NVIDIA device.

The real-hardware check (a CUDA program in a jail box) is scripts/verify_gpu.sh; it needs an
NVIDIA host and is recorded in docs/gpu.md."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import pytest

from execbox.boxes import gpu
from execbox.errors import InvalidConfigError, RateLimitError

from .conftest import make_provider, run

pytestmark = pytest.mark.jail


def test_parse_gpu_and_tenant_cap():
    assert gpu.parse_gpu(None) is None and gpu.parse_gpu("off") is None and gpu.parse_gpu(False) is None
    assert gpu.parse_gpu("all") == gpu.GpuRequest(all=True) == gpu.parse_gpu(True)
    assert gpu.parse_gpu(" 2, 0,2") == gpu.GpuRequest(indices=(0, 2))
    for bad in ("gpu0", "-1", "0,,1", "some", "\u00b2", "0,\u00b9", "\u0663"):  # not ASCII digits either
        with pytest.raises(InvalidConfigError) as e:
            gpu.parse_gpu(bad)
        assert e.value.code == "SB002" and e.value.details["field"] == "gpu"
    assert gpu.parse_tenant_cap("") == {}
    assert gpu.parse_tenant_cap("2") == {"*": 2}
    assert gpu.parse_tenant_cap("acme=4, *=1") == {"acme": 4, "*": 1}
    for bad in ("acme=lots", "acme=\u00b2"):
        with pytest.raises(InvalidConfigError):
            gpu.parse_tenant_cap(bad)


def test_config_validation_rejects_bad_gpu_values():
    from execbox.providers.jail import JailProvider

    assert JailProvider().validate_config({"gpu": "all", "gpu_tenant_cap": "acme=1"}) == (True, None)
    ok, msg = JailProvider().validate_config({"gpu": "first"})
    assert not ok and "gpu" in msg
    ok, msg = JailProvider().validate_config({"gpu_tenant_cap": "x=y"})
    assert not ok and "gpu_tenant_cap" in msg


@pytest.fixture
def fake_dev(monkeypatch):
    """A /dev look-alike with NVIDIA "nodes" as plain files, reachable by a box's host uid."""
    d = tempfile.mkdtemp(prefix="execbox-fakedev-")
    os.chmod(d, 0o755)
    os.mkdir(os.path.join(d, "nvidia-caps"), 0o755)
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-caps/nvidia-cap1", "null"):
        with open(os.path.join(d, name), "w") as f:
            f.write(f"fake {name}\n")
        os.chmod(os.path.join(d, name), 0o666)
    monkeypatch.setenv("EXECBOX_GPU_DEV_ROOT", d)
    yield d
    shutil.rmtree(d)


def test_jail_args_bind_device_nodes_and_libraries_outside_usr(fake_dev):
    inv = gpu.inventory(fake_dev)
    assert inv.indices == [0, 1]
    assert gpu.select(gpu.GpuRequest(indices=(1,)), inv) == [1]
    args = gpu.jail_args([1], inv, ["/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/opt/nvidia/lib64/libcuda.so.1"])
    d = fake_dev
    assert args == [
        # no --remount-ro: bubblewrap's remount adds nodev, and CUDA then cannot open the nodes
        "--dev-bind", f"{d}/nvidia1", "/dev/nvidia1",
        "--dev-bind", f"{d}/nvidiactl", "/dev/nvidiactl",
        "--dev-bind", f"{d}/nvidia-uvm", "/dev/nvidia-uvm",
        "--dev-bind", f"{d}/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap1",
        "--ro-bind", "/opt/nvidia/lib64/libcuda.so.1", "/opt/nvidia/lib64/libcuda.so.1",  # /usr is bound already
    ]
    with pytest.raises(InvalidConfigError) as e:
        gpu.select(gpu.GpuRequest(indices=(0, 3)), inv)
    assert e.value.details["missing"] == [3]


LIST_DEV = """
import os, json, errno
out = {"nvidia": sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))}
try:
    out["read"] = open("/dev/nvidia0").read()
except OSError as e:
    out["read"] = errno.errorcode[e.errno]
try:  # opened read-write, as CUDA opens the real nodes
    os.close(os.open("/dev/nvidia0", os.O_RDWR))
    out["rdwr"] = "OPENED"
except OSError as e:
    out["rdwr"] = errno.errorcode[e.errno]
print(json.dumps(out))
"""


def test_a_jail_box_gets_the_selected_nodes_usable_and_the_tenant_cap_holds(fake_dev):
    p = make_provider(gpu="0", gpu_tenant_cap="acme=1,*=0")
    try:
        assert p.applied_limits()["gpu"] == "0 -> 0"
        a = p.create_instance(tenant_id="acme", session_id="g1")
        out = json.loads(run(p, a.instance_id, LIST_DEV).stdout)
        assert out == {"nvidia": ["nvidia-caps", "nvidia-uvm", "nvidia0", "nvidiactl"], "rdwr": "OPENED",
                       "read": "fake nvidia0\n"}
        with pytest.raises(RateLimitError) as e:  # acme already holds its one GPU
            p.create_instance(tenant_id="acme", session_id="g2")
        assert e.value.code == "SB008" and e.value.details == {
            "field": "gpu_tenant_cap", "tenant": "acme", "cap": 1, "requested": 1, "in_use": 1}
        with pytest.raises(RateLimitError):
            p.create_instance(tenant_id="other", session_id="g3")  # '*' = 0 GPUs
        p.destroy_instance(a.instance_id)
        b = p.create_instance(tenant_id="acme", session_id="g4")  # released with the session
        p.destroy_instance(b.instance_id)
    finally:
        p.shutdown()


def test_the_tenant_cap_holds_for_concurrent_creates(fake_dev):
    """The cap is checked and the box counted under one lock: six creates at once used to all pass
    it (each box was counted only once it had started)."""
    from concurrent.futures import ThreadPoolExecutor

    p = make_provider(gpu="0", gpu_tenant_cap="acme=1")
    try:
        def create(i: int):
            try:
                return p.create_instance(tenant_id="acme", session_id=f"c{i}").instance_id
            except RateLimitError:
                return None

        with ThreadPoolExecutor(6) as pool:
            made = [iid for iid in pool.map(create, range(6)) if iid]
        assert len(made) == 1, made
        p.destroy_instance(made[0])
        p.destroy_instance(p.create_instance(tenant_id="acme", session_id="after").instance_id)  # slot freed
    finally:
        p.shutdown()


def test_gpu_asked_where_the_host_has_none_is_sb002_at_session_creation(tmp_path, monkeypatch):
    monkeypatch.setenv("EXECBOX_GPU_DEV_ROOT", str(tmp_path))  # an empty /dev: no NVIDIA device
    p = make_provider(gpu="all")
    try:
        assert any("no NVIDIA GPU" in w for w in p.warnings())
        with pytest.raises(InvalidConfigError) as e:
            p.create_instance(tenant_id="acme")
        assert e.value.code == "SB002" and e.value.http_status == 400
        assert e.value.details["missing"] == "NVIDIA device" and "no NVIDIA GPU" in e.value.message
    finally:
        p.shutdown()


def test_a_box_without_the_opt_in_sees_no_nvidia_device(jail, box, fake_dev):
    code = ("import os, json\nout = sorted(n for n in os.listdir('/dev') if 'nvidia' in n)\n"
            "print(json.dumps([out, os.path.exists('/dev/nvidia0'), os.path.exists('/dev/nvidiactl')]))")
    assert json.loads(run(jail, box, code).stdout) == [[], False, False]
