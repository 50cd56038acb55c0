"""Pause and resume on a real service (jail): the box stops, files stay, the same id comes back;
paused sessions past their retention are deleted; idle sessions may be paused instead of destroyed."""

from __future__ import annotations

import os
import time

from .conftest import Service, error_of


def _wait(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_pause_stops_the_box_keeps_files_and_resume_brings_the_same_session_back(service_factory) -> None:
    svc: Service = service_factory()
    c = svc.a
    assert c.post("/v1/sandbox/write", json={"session_id": "p", "path": "f", "content": "paused"}).status_code == 200
    s = svc.app.state.services.sessions.get("tenant-a", "p")
    instance = s.instance_id
    r = c.post("/v1/sandbox/sessions/tenant-a/p/pause")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["state"] == "paused" and body["instance_id"] is None and body["expires_at"] > time.time() + 86000
    assert not s.provider.instance_alive(instance)  # CPU and memory freed
    assert svc.store.sessions.get("tenant-a", "p").state == "paused"
    assert c.get("/v1/sandbox/sessions/tenant-a/p").json()["state"] == "paused"
    assert svc.b.post("/v1/sandbox/sessions/tenant-a/p/pause").status_code == 403  # another tenant
    r = c.post("/v1/sandbox/sessions/tenant-a/p/resume")
    assert r.status_code == 200 and r.json()["state"] == "running"
    assert r.json()["expires_at"] <= time.time() + 900  # the retention is over: its idle expiry now
    assert r.json()["contexts_lost"] is True  # the jail keeps no process memory across a pause
    r = c.post("/v1/sandbox/read", json={"session_id": "p", "path": "f"})
    assert r.status_code == 200 and r.json()["content"] == "paused"
    r = c.post("/v1/sandbox/sessions/tenant-a/p/resume")
    assert r.status_code == 409 and error_of(r)["details"]["reason"] == "not_paused"
    assert c.post("/v1/sandbox/sessions/tenant-a/nope/pause").status_code == 404
    # using a paused session resumes it
    c.post("/v1/sandbox/sessions/tenant-a/p/pause")
    r = c.post("/v1/sandbox/execute", json={"session_id": "p", "code": "print(open('f').read())"})
    assert r.status_code == 200 and r.json()["stdout"] == "paused\n"
    assert svc.store.sessions.get("tenant-a", "p").state == "running"


def test_expired_paused_sessions_are_deleted_and_idle_ones_paused(service_factory) -> None:
    svc: Service = service_factory(idle_timeout=0.5, reap_interval=0.2, idle_action="pause",
                                   paused_retention=1.5)
    c = svc.a
    c.post("/v1/sandbox/write", json={"session_id": "idle", "path": "f", "content": "1"})
    ws = os.path.join(svc.workspaces, "tenant-a", "idle")
    assert _wait(lambda: svc.store.sessions.get("tenant-a", "idle").state == "paused", 5)
    assert os.path.isdir(ws)
    assert _wait(lambda: svc.store.sessions.get("tenant-a", "idle") is None, 8)  # retention ran out
    assert _wait(lambda: not os.path.exists(ws), 5)
    assert svc.app.state.services.sessions.get("tenant-a", "idle") is None


def test_sdk_and_cli_show_and_change_session_state(service_factory) -> None:
    import json
    import subprocess

    from execbox import RemoteSandbox

    from .test_serve_cli import EXECBOX

    svc: Service = service_factory()
    token = svc.a.headers["authorization"].split()[1]
    with RemoteSandbox(svc.url, token, session_id="sdk") as sb:
        assert sb.run_code("print(1)").stdout == "1\n"
        assert sb.info()["state"] == "running" and sb.info()["owner"]
        assert sb.pause()["state"] == "paused"
        env = {**os.environ, "EXECBOX_DATA_DIR": str(svc.store.data_dir), "EXECBOX_URL": svc.url,
               "EXECBOX_TOKEN": token}
        out = subprocess.run([EXECBOX, "session", "ls", "--json"], env=env, capture_output=True, text=True,
                             timeout=60, check=True).stdout
        (row,) = json.loads(out)
        assert row["session_id"] == "sdk" and row["state"] == "paused" and row["expires_at"] > time.time()
        done = subprocess.run([EXECBOX, "session", "resume", "tenant-a", "sdk"], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0 and "resumed tenant-a/sdk" in done.stdout, done.stderr
        assert sb.info()["state"] == "running"
        refused = subprocess.run([EXECBOX, "session", "rm", "tenant-a", "sdk"], capture_output=True, text=True,
                                 env={**env, "EXECBOX_TOKEN": svc.tenant_b}, timeout=60)
        assert refused.returncode != 0 and "SB002" in refused.stderr  # another tenant's token: 403
        done = subprocess.run([EXECBOX, "session", "rm", "tenant-a", "sdk"], env=env, capture_output=True,
                              text=True, timeout=60)  # the session's own tenant may remove it (POST .../close)
        assert done.returncode == 0 and "removed tenant-a/sdk" in done.stdout, done.stderr
        assert svc.store.sessions.get("tenant-a", "sdk") is None


def test_a_draining_replica_refuses_new_work_with_sb009(service_factory) -> None:
    svc: Service = service_factory()
    assert svc.a.post("/v1/sandbox/execute", json={"session_id": "dr", "code": "print(1)"}).status_code == 200
    svc.app.state.services.sessions._draining = True  # what shutdown() sets first on SIGTERM
    try:
        for body in ({"session_id": "dr", "code": "print(1)"}, {"code": "print(1)"}):
            r = svc.a.post("/v1/sandbox/execute", json=body)
            assert r.status_code == 503 and error_of(r)["code"] == "SB009"
            assert error_of(r)["details"]["reason"] == "draining"
    finally:
        svc.app.state.services.sessions._draining = False


def test_listing_a_paused_sessions_processes_does_not_resume_it(service_factory) -> None:
    """Review 32, F6: GET .../processes resumed a paused session (a box started to answer []), so
    an MCP client polling list_processes kept paused sessions awake."""
    svc: Service = service_factory()
    c = svc.a
    r = c.post("/v1/sandbox/sessions/tenant-a/pp/processes", json={"command": "sleep 60"})
    assert r.status_code == 201, r.text
    assert c.post("/v1/sandbox/sessions/tenant-a/pp/pause").status_code == 200
    r = c.get("/v1/sandbox/sessions/tenant-a/pp/processes")
    assert r.status_code == 200 and r.json()["processes"] == [], r.text  # its box, and the process, are gone
    assert svc.store.sessions.get("tenant-a", "pp").state == "paused"
    assert c.get("/v1/sandbox/sessions/tenant-a/pp").json()["state"] == "paused"
    assert c.get("/v1/sandbox/sessions/tenant-a/never/processes").status_code == 404  # unknown: still 404
