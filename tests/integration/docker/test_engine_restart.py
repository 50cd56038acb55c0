"""The Docker provider across a restart of its engine, and beside a second engine on the same host
(review 40, findings 1, 3 and 4), on a private dockerd (tests/integration/docker/private_engine.py):
the shared engine is never stopped.

* A session box that dies while dockerd is down: its container cannot be removed then, so its
  workspace stays mounted. That removal is retried: a request while the engine is down gets a
  quick SB009 "the Docker engine is unavailable" (it used to wait 30 s for the mount, then SB009
  "previous owner"); the first request after the engine is back gets a fresh box with the files,
  and a session nobody uses is unmounted in the background.
* The warm pool's boxes from before the restart are dead: none is handed out. While the engine is
  down a one-shot gets the same quick SB009 instead of waiting ``pool_wait`` for a refill that
  cannot start (and then SB004).
* A provider on another engine leaves this engine's live boxes' host dirs and uid pins alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import execbox
from execbox.boxes import docker_host, quota, uids
from execbox.errors import ProviderUnavailableError
from tests.conftest import require
from tests.integration.docker.conftest import runtimes_of
from tests.integration.docker.private_engine import PrivateEngine

pytestmark = pytest.mark.docker

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="module")
def engine(docker_engine):
    """A private dockerd with the worker image (the shared engine's fixture built or cached it)."""
    require(os.geteuid() == 0, "root (a second dockerd)")
    require(subprocess.run(["which", "dockerd"], capture_output=True).returncode == 0, "dockerd")  # noqa: S607
    shared_bridge = os.path.exists("/sys/class/net/docker0")
    e = PrivateEngine()
    try:
        e.start()
        e.import_image()
        yield e
    finally:
        e.close()
    # the shared engine's bridge is still there (a dockerd started with --bridge=none deletes it)
    assert os.path.exists("/sys/class/net/docker0") or not shared_bridge, "the private engine deleted docker0"


def _provider(url: str, pool: int):
    from execbox.providers.docker import DockerProvider

    p = DockerProvider()
    p.initialize({"docker_host": url, "runtime": "runc", "pool_size": pool, "pool_wait": 60,
                  "max_memory": "256m", "preload": "none", "timeout": 30})
    return p


def _wait(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_a_session_whose_box_died_with_the_engine_recovers_once_it_is_back(engine, tmp_path):
    p = _provider(engine.url, pool=1)
    try:
        ws = {s: str(tmp_path / s) for s in ("used", "idle")}
        inst = {}
        for s, path in ws.items():
            os.makedirs(path)
            inst[s] = p.create_instance(tenant_id="t1", session_id=s, workspace=path).instance_id
            assert p.execute_code(inst[s], f"open('f', 'w').write('{s}')", "python").exit_code == 0
        assert _wait(lambda: p.pool_status()["ready"] == 1, 60)

        engine.stop()
        for s in ws:  # what the session manager does with a box that died: SB009 once, then destroy it
            with pytest.raises(ProviderUnavailableError):
                p.execute_code(inst[s], "print(1)", "python")
            p.destroy_instance(inst[s])
        time.sleep(0.5)  # the background removal fails: the engine is down
        assert quota.is_mounted(ws["used"]) and quota.is_mounted(ws["idle"])

        t0 = time.monotonic()
        with pytest.raises(ProviderUnavailableError) as ei:
            p.create_instance(tenant_id="t1", session_id="used", workspace=ws["used"])
        assert time.monotonic() - t0 < 5, "waited for the mount instead of answering"
        assert ei.value.details["reason"] == "docker_engine_unavailable"
        with pytest.raises(ProviderUnavailableError) as ei:  # a new session: the same answer
            p.create_instance(tenant_id="t1", session_id="new", workspace=str(tmp_path / "new"))
        assert ei.value.details["reason"] == "docker_engine_unavailable"
        for _ in range(2):  # a one-shot: the pool's box died with the engine and no refill can start
            t0 = time.monotonic()
            with pytest.raises(ProviderUnavailableError) as ei:
                p.create_instance(tenant_id="t1", session_id=None)
            assert time.monotonic() - t0 < 5, "waited pool_wait (60 s) for a refill that could not start"
            assert ei.value.details["reason"] == "docker_engine_unavailable"

        engine.start()
        t0 = time.monotonic()
        again = p.create_instance(tenant_id="t1", session_id="used", workspace=ws["used"]).instance_id
        assert time.monotonic() - t0 < 20
        r = p.execute_code(again, "print(open('f').read())", "python")
        assert r.stdout == "used\n"
        # the warm pool's box from before the restart died with it: not handed out
        one = p.create_instance(tenant_id="t1", session_id=None).instance_id
        assert p.execute_code(one, "print(2)", "python").stdout == "2\n"
        p.destroy_instance(one)
        # nobody asked for the idle session again: the retries freed its workspace anyway
        assert _wait(lambda: not quota.is_mounted(ws["idle"]), 30), "the failed removal was never retried"
        assert _wait(lambda: not p._removals.pending(), 30)
        p.destroy_instance(again)
    finally:
        if engine.proc is None or engine.proc.poll() is not None:
            engine.start()
        p.shutdown()


A_BOX = """
import json, os, sys
from execbox.providers.docker import DockerProvider
p = DockerProvider()
p.initialize({"runtime": "runc", "pool_size": 0, "max_memory": "256m", "preload": "none"})
i = p.create_instance(tenant_id="t1", session_id="x", workspace=sys.argv[1])
box = p._instances[i.instance_id].box
print(json.dumps({"container": box.container_id, "labels": box.spec.labels}), flush=True)
os._exit(0)  # as kill -9 would: the container keeps running, nothing is undone
"""


def test_a_provider_on_another_engine_leaves_this_engine_s_live_boxes_alone(engine, docker_engine, tmp_path):
    """Review 40, finding 4: a service on a second engine swept the host dir (workspace mounts,
    passwd) and the uid pin of a box that a killed service left running on the first engine."""
    require(runtimes_of(docker_engine) >= {"runc"}, "runc")
    ws = str(tmp_path / "x")
    src = os.path.dirname(os.path.dirname(os.path.abspath(execbox.__file__)))  # the code under test
    out = subprocess.run([sys.executable, "-c", A_BOX, ws], capture_output=True, text=True, timeout=180,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": src}, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    left = json.loads(out.stdout.strip().splitlines()[-1])
    labels = left["labels"]
    host_dir, uid = labels["execbox.host_dir"], int(labels["execbox.run_as"])
    try:
        assert os.path.isdir(host_dir) and quota.is_mounted(ws) and uids.pin_note(uid)
        other = _provider(engine.url, pool=0)  # its start sweeps what dead processes left
        other.shutdown()
        assert os.path.isdir(host_dir), "the other engine's sweep removed a live box's host dir"
        assert quota.is_mounted(ws), "the other engine's sweep unmounted a live box's workspace"
        assert uids.pin_note(uid) is not None, "the other engine's sweep unpinned a live box's uid"
        state = docker_engine.api.inspect_container(left["container"])["State"]
        assert state["Running"]
    finally:
        try:
            docker_engine.api.remove_container(left["container"], force=True)
        finally:
            docker_host.release_removed(labels)
    assert not quota.is_mounted(ws) and not os.path.exists(host_dir) and uids.pin_note(uid) is None
