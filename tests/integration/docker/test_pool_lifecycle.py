"""Warm pool, exhaustion, failure healing, a box killed from outside, stale cleanup, config errors."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import threading
import time

import pytest

from execbox.errors import InstanceCreationError, InvalidConfigError, ProviderUnavailableError
from execbox.providers.docker import OWNER_LABEL, DockerProvider

pytestmark = pytest.mark.docker


def _wait(cond, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def test_pool_refills_after_one_shot_runs(provider):
    assert _wait(lambda: provider.pool_status()["ready"] == 2)
    before = provider.pool_status()["started_total"]
    seen = set()
    for i in range(4):
        inst = provider.create_instance(tenant_id="t", session_id=None)
        assert inst.metadata["from_pool"] is True
        seen.add(inst.metadata["container"])
        assert provider.execute_code(inst.instance_id, f"print({i})", "python").stdout == f"{i}\n"
        provider.destroy_instance(inst.instance_id)
    assert len(seen) == 4  # never reused across instances
    assert _wait(lambda: provider.pool_status()["ready"] == 2)
    status = provider.pool_status()
    assert status["started_total"] >= before + 4 and status["healthy"]


def test_killed_from_outside_mid_run_is_sb009_and_pool_stays_healthy(provider, docker_engine):
    inst = provider.create_instance(tenant_id="t", session_id="kill")
    box = provider._instances[inst.instance_id].box
    errors: list[BaseException] = []

    def run() -> None:
        try:
            provider.execute_code(inst.instance_id, "import time; time.sleep(60)", "python", timeout=90)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(1.0)
    docker_engine.api.kill(box.container_id)
    t.join(30)
    assert errors and isinstance(errors[0], ProviderUnavailableError) and errors[0].code == "SB009"
    assert errors[0].details.get("box_died") is True
    with pytest.raises(ProviderUnavailableError):  # stays dead, never half-alive
        provider.execute_code(inst.instance_id, "print(1)", "python")
    assert not provider.instance_alive(inst.instance_id)
    provider.destroy_instance(inst.instance_id)
    assert provider.pool_status()["healthy"]
    fresh = provider.create_instance(tenant_id="t", session_id=None)
    try:
        assert provider.execute_code(fresh.instance_id, "print('ok')", "python").stdout == "ok\n"
    finally:
        provider.destroy_instance(fresh.instance_id)


def test_exhausted_pool_waits_then_sb004_with_reason(docker_engine):
    p = DockerProvider()
    p.initialize({"runtime": "runc", "pool_size": 1, "pool_wait": 0, "preload": "none"})
    try:
        assert _wait(lambda: p.pool_status()["ready"] == 1)
        first = p.create_instance()
        with pytest.raises(InstanceCreationError) as ei:
            p.create_instance()
        assert ei.value.code == "SB004" and "in use" in ei.value.message
        assert ei.value.details["pool"]["size"] == 1
        p.destroy_instance(first.instance_id)
    finally:
        p.shutdown()


@pytest.fixture
def broken_image(docker_engine):
    """An image without python3: every container start fails."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"not a runtime\n"
        info = tarfile.TarInfo("README")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    docker_engine.api.import_image_from_data(buf.getvalue(), repository="execbox-test/broken", tag="latest")
    yield "execbox-test/broken:latest"
    docker_engine.images.remove("execbox-test/broken:latest", force=True)


def test_failing_pool_reports_why_and_sb004(broken_image):
    p = DockerProvider()
    p.initialize({"runtime": "runc", "pool_size": 1, "pool_wait": 1, "image": broken_image})
    try:
        assert _wait(lambda: p.pool_status()["failures"] >= 1, 30)
        status = p.pool_status()
        assert status["healthy"] is False and status["last_error"]
        with pytest.raises(InstanceCreationError) as ei:
            p.create_instance()
        assert "failing to start" in ei.value.message
    finally:
        p.shutdown()


def test_stale_resources_of_dead_process_are_removed(docker_engine):
    dead = subprocess.Popen(["/bin/true"])  # noqa: S603 - a pid that is gone by the time we look
    dead.wait()
    import socket

    stale_owner = f"{socket.gethostname()}:{dead.pid}:1"
    labels = {OWNER_LABEL: stale_owner, "execbox.tenant": "old"}
    vol = docker_engine.volumes.create(labels=labels)
    c = docker_engine.containers.create("execbox/python:latest", ["/bin/true"], labels=labels,
                                        network_mode="none")
    p = DockerProvider()
    p.initialize({"runtime": "runc", "pool_size": 0})
    try:
        names = {x.name for x in docker_engine.containers.list(all=True, ignore_removed=True)}
        assert c.name not in names
        assert vol.name not in {v.name for v in docker_engine.volumes.list()}
    finally:
        p.shutdown()


def test_cold_start_without_pool_has_exact_labels(docker_engine):
    p = DockerProvider()
    p.initialize({"runtime": "runc", "pool_size": 0, "preload": "none"})
    try:
        inst = p.create_instance(tenant_id="acme", session_id="s-9")
        box = p._instances[inst.instance_id].box
        labels = docker_engine.api.inspect_container(box.container_id)["Config"]["Labels"]
        assert labels["execbox.tenant"] == "acme" and labels["execbox.session"] == "s-9"
        assert labels["execbox.instance"] == inst.instance_id
        host_dir = box.host.host_dir
        if os.geteuid() == 0:  # the box's uid and host dir, for a restarted service (docker_host.py)
            assert labels["execbox.run_as"] == str(box.host.uid) and labels["execbox.host_dir"] == host_dir
            assert os.path.isdir(host_dir)
        p.destroy_instance(inst.instance_id)
        assert _wait(lambda: host_dir is None or not os.path.exists(host_dir), 30)
    finally:
        p.shutdown()


@pytest.mark.parametrize("field,value", [("max_memory", "2g"), ("runtime", "kata"), ("pool_size", 101),
                                         ("pids_limit", 0), ("bogus", 1)])
def test_bad_config_is_sb002(field, value):
    with pytest.raises(InvalidConfigError) as ei:
        DockerProvider().initialize({field: value})
    assert ei.value.code == "SB002" and field in ei.value.details["fields"]


def test_gpu_opt_in_flags(docker_engine, monkeypatch):
    monkeypatch.setenv("SANDBOX_GPU_ENABLED", "true")
    p = DockerProvider()
    p.initialize({"runtime": "runc", "pool_size": 0, "network": "open"})
    try:
        kw = p.container_spec().create_kwargs()
        (req,) = kw["device_requests"]
        assert req["Count"] == -1 and req["Capabilities"] == [["gpu"]]
        assert kw["network_mode"] == "none"  # GPU containers stay offline unless allowed
        monkeypatch.setenv("SANDBOX_GPU_NETWORK_ENABLED", "true")
        p.shutdown()
        p = DockerProvider()
        p.initialize({"runtime": "runc", "pool_size": 0})
        assert p.egress_cap.mode == "open"  # through the egress gateway, never a bridge
        assert p.container_spec().create_kwargs()["network_mode"] == "none"
    finally:
        p.shutdown()
    monkeypatch.delenv("SANDBOX_GPU_ENABLED")
    monkeypatch.delenv("SANDBOX_GPU_NETWORK_ENABLED")
    q = DockerProvider()
    q.initialize({"runtime": "runc", "pool_size": 0})
    try:
        kw = q.container_spec().create_kwargs()
        assert "device_requests" not in kw and kw["network_mode"] == "none"
    finally:
        q.shutdown()


def test_owner_label_identifies_this_process():
    from execbox.boxes.docker_owner import owner_id, owner_is_gone

    assert not owner_is_gone(owner_id())
    assert owner_is_gone(owner_id().rsplit(":", 1)[0] + ":0")
    assert not owner_is_gone("other-host:1:1")
    assert os.getpid() == int(owner_id().split(":")[1])


def test_host_workspace_is_bound_and_kept(provider, tmp_path):
    ws = tmp_path / "ws"
    inst = provider.create_instance(tenant_id="t", session_id="persist", workspace=str(ws))
    try:
        assert inst.metadata["from_pool"] is False
        r = provider.execute_code(inst.instance_id, "open('kept.txt', 'w').write('x')", "python")
        assert r.exit_code == 0, r.stderr
    finally:
        provider.destroy_instance(inst.instance_id)
    assert (ws / "kept.txt").read_text() == "x"


def test_health_and_zero_config_availability(provider):
    assert provider.health_check()
    ok, reason = DockerProvider.availability()
    assert ok, reason
    assert "runsc" in reason
