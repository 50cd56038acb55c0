"""Pause and resume of a Docker session (runc and runsc) on a real service: the container is
removed (its CPU and memory freed), the workspace is kept, and the same session id comes back
with its files; contexts are reported lost (no checkpoint/restore: see docs/sessions.md)."""

from __future__ import annotations

import time

import docker.errors

from tests.integration.service.conftest import start_service


def _gone(engine, container_id: str) -> bool:
    try:
        engine.containers.get(container_id)
    except docker.errors.NotFound:
        return True
    return False


def test_docker_pause_frees_the_container_keeps_files_and_resumes(provider, docker_engine) -> None:
    svc = start_service(provider)
    try:
        c = svc.a
        r = c.post("/v1/sandbox/execute", json={"session_id": "p", "context_id": "c",
                                                 "code": "x = 1\nopen('f', 'w').write('kept')"})
        assert r.status_code == 200, r.text
        container = svc.store.sessions.get("tenant-a", "p").box_handle["container_id"]
        r = c.post("/v1/sandbox/sessions/tenant-a/p/pause")
        assert r.status_code == 200 and r.json()["state"] == "paused", r.text
        deadline = time.monotonic() + 30
        while not _gone(docker_engine, container) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone(docker_engine, container)  # CPU and memory freed: no container at all
        r = c.post("/v1/sandbox/execute", json={"session_id": "p", "context_id": "c",
                                                 "code": "print(open('f').read(), globals().get('x'))"})
        assert r.status_code == 200 and r.json()["stdout"] == "kept None\n", r.text  # resumed by use
        assert r.json()["metadata"]["session"] == {"contexts_lost": True}
        rec = svc.store.sessions.get("tenant-a", "p")
        assert rec.state == "running" and rec.box_handle["container_id"] != container
    finally:
        svc.root.delete("/v1/sandbox/sessions/tenant-a/p")  # a kept session's container would outlive the test
        svc.stop()
