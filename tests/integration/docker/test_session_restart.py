"""A Docker session (runc and gVisor's runsc) survives a restart of a real `execbox serve`: SIGTERM
leaves its container running, the next start re-attaches to the agent over a new attach stream,
and the Python context's globals are still there. A labelled container no registry row knows is
removed."""

from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from execbox.service.store import open_store
from tests.conftest import require
from tests.integration.docker.conftest import runtimes_of
from tests.integration.service.conftest import registry_workspaces, traversable_tmpdir
from tests.integration.service.test_serve_cli import EXECBOX, _serve, _wait_ready
from tests.integration.service.test_session_restart import _term


def _labelled(client, label: str) -> list:
    return client.containers.list(all=True, filters={"label": label}, ignore_removed=True)


def _docker_service(prefix: str, replica: str, runtime: str) -> tuple[dict[str, str], str, str, str]:
    """A service's environment on its own data and workspaces, with the docker provider active on
    ``runtime`` (no pool); (env, tenant token, admin token, the label of its session containers)."""
    base = traversable_tmpdir(prefix)
    ws = os.path.join(base, "ws")
    env = {**os.environ, "EXECBOX_DATA_DIR": os.path.join(base, "data"), "EXECBOX_WORKSPACES_DIR": ws,
           "EXECBOX_REPLICA_ID": replica}
    env.pop("SANDBOX_TYPE", None)
    with open_store(data_dir=os.path.join(base, "data")) as store:
        _, tenant = store.tokens.create("t1")
        _, admin = store.tokens.create("ops", role="admin")
    subprocess.run([EXECBOX, "config", "set", "docker", f"runtime={runtime}", "pool_size=0", "--activate"],
                   env=env, check=True, capture_output=True, timeout=120)
    return env, tenant, admin, f"execbox.registry={registry_workspaces(ws, os.path.join(base, 'data'))}"


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_docker_session_keeps_its_context_across_a_restart(docker_engine, runtime: str) -> None:
    require(runtime in runtimes_of(docker_engine), f"docker runtime {runtime}")
    env, tenant, admin, label = _docker_service("execbox-dkrestart-", "r-docker", runtime)
    root = label.split("=", 1)[1]
    auth = {"Authorization": f"Bearer {tenant}"}
    stray = None
    try:
        proc, url = _serve(env)
        try:
            _wait_ready(proc, url)
            c = httpx.Client(base_url=url, headers=auth, timeout=120)
            r = c.post("/v1/sandbox/execute", json={"session_id": "d", "context_id": "c",
                                                     "code": "x = 41\nopen('f', 'w').write('dk')"})
            assert r.status_code == 200, r.text
        finally:
            _term(proc)
        (container,) = docker_engine.containers.list(filters={"label": label}, ignore_removed=True)
        assert container.status == "running"  # detached, not removed
        image = container.attrs["Config"]["Image"]
        stray = docker_engine.containers.create(image, command=["sleep", "60"], labels={"execbox.registry": root})

        proc, url = _serve(env)
        try:
            _wait_ready(proc, url)
            c = httpx.Client(base_url=url, headers=auth, timeout=120)
            r = c.post("/v1/sandbox/execute", json={"session_id": "d", "context_id": "c",
                                                     "code": "print(x + 1, open('f').read())"})
            assert r.status_code == 200, r.text
            if r.json()["stdout"] != "42 dk\n":  # show why the re-attach failed
                proc.send_signal(subprocess.signal.SIGTERM)
                raise AssertionError(f"{r.json()}\n{proc.communicate(timeout=60)[1][-3000:]}")
            assert "session" not in r.json()["metadata"]  # nothing was lost
            # the re-attached agent was asked whether it serves files beside runs: a run waiting
            # for a file is released by a write through the API
            waiting = "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.05)\nprint('went')"
            with ThreadPoolExecutor(1) as pool:
                run = pool.submit(c.post, "/v1/sandbox/execute",
                                  json={"session_id": "d", "code": waiting, "timeout": 60})
                time.sleep(1.0)
                assert not run.done()
                w = c.post("/v1/sandbox/write", json={"session_id": "d", "path": "go", "content": "1"})
                assert w.status_code == 200, w.text
                assert run.result(timeout=60).json()["stdout"] == "went\n"
            ids = [k.id for k in _labelled(docker_engine, label)]
            assert ids == [container.id]  # the stray one was removed at start
            stray = None
            r = httpx.delete(f"{url}/v1/sandbox/sessions/t1/d", headers={"Authorization": f"Bearer {admin}"},
                             timeout=60)
            assert r.status_code == 200
            deadline = time.monotonic() + 90  # runsc teardown on a loaded host is slow
            while _labelled(docker_engine, label) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _labelled(docker_engine, label) == []  # rm removes it
        finally:
            _term(proc)
    finally:
        for k in _labelled(docker_engine, label):
            k.remove(force=True)
        if stray is not None:
            try:
                stray.remove(force=True)
            except Exception:  # noqa: BLE001
                pass


def test_a_run_left_by_a_killed_service_does_not_hold_the_re_attached_box(docker_engine) -> None:
    """kill -9 of the service mid-run leaves the container and its agent running that run; the
    next service re-attaches, and its first request is served at once (the orphan run, whose
    requester is gone, is cancelled: a Python cell is interrupted and its context kept), not
    after the orphan's two minutes."""
    require("runc" in runtimes_of(docker_engine), "docker runtime runc")
    env, tenant, _, label = _docker_service("execbox-dkorphan-", "r-orphan", "runc")
    auth = {"Authorization": f"Bearer {tenant}"}
    try:
        proc, url = _serve(env)
        try:
            _wait_ready(proc, url)
            c = httpx.Client(base_url=url, headers=auth, timeout=120)
            r = c.post("/v1/sandbox/execute", json={"session_id": "o", "context_id": "c", "code": "x = 41"})
            assert r.status_code == 200, r.text
            with ThreadPoolExecutor(1) as pool:
                pool.submit(c.post, "/v1/sandbox/execute", json={
                    "session_id": "o", "context_id": "c", "timeout": 300,
                    "code": "import time\nprint('started', flush=True)\ntime.sleep(120)"})
                time.sleep(2.0)  # the cell is running in the container
                proc.kill()
                proc.wait(30)
        finally:
            if proc.poll() is None:
                _term(proc)
        proc, url = _serve(env)
        try:
            _wait_ready(proc, url)
            c = httpx.Client(base_url=url, headers=auth, timeout=45)  # well short of the orphan's 120 s
            r = c.post("/v1/sandbox/execute", json={"session_id": "o", "context_id": "c", "code": "print(x + 1)"})
            assert r.status_code == 200 and r.json()["stdout"] == "42\n", r.text
        finally:
            _term(proc)
    finally:
        for k in _labelled(docker_engine, label):
            k.remove(force=True)
