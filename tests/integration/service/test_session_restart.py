"""Sessions survive restarts of real `execbox serve` processes (jail): files kept, contexts reported
lost, workspaces without a registry row removed, a row whose workspace is gone is `lost`, and a
SIGTERM during ten in-flight runs lets them finish and leaves every session usable."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time

import httpx
from sqlalchemy import text

from execbox.boxes.jail_box import boxes_dir
from execbox.sdk.wire import iter_events
from execbox.service.store import open_store
from tests.conftest import pids_naming

from .conftest import registry_workspaces, traversable_tmpdir
from .test_serve_cli import _serve, _wait_ready


def _env(base: str) -> dict[str, str]:
    return {**os.environ, "EXECBOX_DATA_DIR": os.path.join(base, "data"), "SANDBOX_TYPE": "jail",
            "EXECBOX_WORKSPACES_DIR": os.path.join(base, "ws"), "EXECBOX_REPLICA_ID": "r-restart",
            "EXECBOX_DRAIN_TIMEOUT": "20"}


def _token(base: str) -> dict[str, str]:
    with open_store(data_dir=os.path.join(base, "data")) as store:
        _, plaintext = store.tokens.create("t1")
    return {"Authorization": f"Bearer {plaintext}"}


def _term(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, -signal.SIGTERM), err  # uvicorn re-raises the signal after its shutdown
    # every box the service started is gone, pooled ones too (their command lines name the box dir
    # jail-<service pid>-..., not the session's workspace)
    assert _bwraps_under(os.path.join(boxes_dir(), f"jail-{proc.pid}-")) == []
    return err


def _kill_now(proc: subprocess.Popen) -> None:
    """SIGKILL the service (no drain, no final audit rows) and every box it started."""
    proc.kill()
    proc.communicate(timeout=30)
    for pid in _bwraps_under(os.path.join(boxes_dir(), f"jail-{proc.pid}-")):
        os.kill(pid, signal.SIGKILL)


_bwraps_under = pids_naming  # the boxes under a box dir prefix


def _pool(c: httpx.Client, state: str) -> float:
    """The jail warm pool's ``state`` gauge from /metrics."""
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("execbox_pool_boxes{") and 'provider="jail"' in line and f'state="{state}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_restart_keeps_files_reports_lost_contexts_cleans_orphans_and_marks_lost(jail_provider) -> None:
    base = traversable_tmpdir("execbox-restart-")
    env, auth = _env(base), _token(base)
    proc, url = _serve(env)
    try:
        _wait_ready(proc, url)
        c = httpx.Client(base_url=url, headers=auth, timeout=60)
        for sid in ("keep", "gone"):  # "keep" runs the jail's sci runtime template
            r = c.post("/v1/sandbox/execute", json={"session_id": sid, "context_id": "c",
                                                     "code": "x = 41\nopen('f', 'w').write('kept')",
                                                     **({"runtime": "sci"} if sid == "keep" else {})})
            assert r.status_code == 200, r.text
            if sid == "keep":
                runtime = r.json()["metadata"]["runtime"]
                assert runtime.startswith("sci")
        assert c.post("/v1/sandbox/execute", json={"session_id": "keep", "context_id": "c",
                                                  "code": "print(x + 1)"}).json()["stdout"] == "42\n"
        info = c.get("/v1/sandbox/sessions/t1/keep").json()
        assert info["state"] == "running" and info["owner"] == "r-restart" and not info["contexts_lost"]
    finally:
        _term(proc)
    ws = registry_workspaces(os.path.join(base, "ws"), os.path.join(base, "data"))
    assert _bwraps_under(ws) == []  # every box stopped
    # the files stay on disk: in place, or inside the workspace's quota image (jail as root)
    assert set(os.listdir(os.path.join(ws, "t1", "keep"))) & {"f", ".execbox-workspace.img"}
    shutil.rmtree(os.path.join(ws, "t1", "gone"))  # its disk is lost while the service is down
    os.makedirs(os.path.join(ws, "t1", "stray"))  # a workspace no registry row knows
    with open_store(data_dir=os.path.join(base, "data")) as store:  # a first request cut off by kill -9:
        store.sessions.create("t1", "cutoff", provider="jail", runtime=None, owner="r-restart", lease_ttl=30,
                              tenant_limit=100, global_limit=100)  # its row "creating", no box ever started
    os.makedirs(os.path.join(ws, "t1", "cutoff"))

    proc, url = _serve(env)
    try:
        _wait_ready(proc, url)
        c = httpx.Client(base_url=url, headers=auth, timeout=60)
        assert not os.path.exists(os.path.join(ws, "t1", "stray"))
        # the cut-off creation ended as a failed one does: row and workspace gone, not a session
        # nobody was told of that holds a slot (it stayed "creating" in the store, "running" in the API)
        assert not os.path.exists(os.path.join(ws, "t1", "cutoff"))
        r = c.get("/v1/sandbox/sessions/t1/cutoff", headers={"X-Execbox-Create-Session": "false"})
        assert r.status_code == 404, r.text
        with open_store(data_dir=os.path.join(base, "data")) as store:
            assert store.sessions.get("t1", "cutoff") is None
        info = c.get("/v1/sandbox/sessions/t1/keep").json()
        assert info["state"] == "running" and info["contexts_lost"] is True
        r = c.post("/v1/sandbox/execute", json={"session_id": "keep", "context_id": "c",
                                                 "code": "print(open('f').read(), globals().get('x'))"})
        assert r.status_code == 200 and r.json()["stdout"] == "kept None\n"
        assert r.json()["metadata"]["runtime"] == runtime  # the registry kept the session's runtime
        assert r.json()["metadata"]["session"] == {"contexts_lost": True}  # reported once
        r = c.post("/v1/sandbox/execute", json={"session_id": "keep", "code": "print(2)"})
        assert "session" not in r.json()["metadata"]
        r = c.post("/v1/sandbox/execute", json={"session_id": "gone", "code": "print(1)"})
        assert r.status_code == 410, r.text
        err = r.json()["error"]
        assert err["code"] == "SB009" and err["details"]["state"] == "lost"
        assert c.get("/v1/sandbox/sessions/t1/gone").json()["state"] == "lost"
    finally:
        _term(proc)


def test_sigterm_during_ten_runs_lets_them_finish_and_sessions_survive(jail_provider) -> None:
    base = traversable_tmpdir("execbox-drain-")
    env, auth = _env(base), _token(base)
    proc, url = _serve(env)
    results: dict[int, httpx.Response | Exception] = {}
    try:
        _wait_ready(proc, url)
        c = httpx.Client(base_url=url, headers=auth, timeout=60)
        deadline = time.monotonic() + 30  # the jail's warm pool is full: the first sessions adopt pooled boxes
        while _pool(c, "ready") < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        for i in range(10):  # the sessions exist (boxes started) before the runs
            assert c.post("/v1/sandbox/write", json={"session_id": f"d{i}", "path": "n", "content": str(i)}
                          ).status_code == 200
        assert _pool(c, "handed_out") >= 2  # pool_sessions (the default): restart must hold for adopted images

        def run(i: int) -> None:
            try:
                results[i] = httpx.post(f"{url}/v1/sandbox/execute", headers=auth, timeout=60, json={
                    "session_id": f"d{i}",
                    "code": "open('started', 'w').close()\nimport time\ntime.sleep(1.5)\nprint(open('n').read())"})
            except Exception as e:  # noqa: BLE001 - a refused connection is a valid outcome
                results[i] = e

        threads = [threading.Thread(target=run, args=(i,)) for i in range(10)]
        for t in threads:
            t.start()
        ws = registry_workspaces(os.path.join(base, "ws"), os.path.join(base, "data"))
        started = [os.path.join(ws, "t1", f"d{i}", "started") for i in range(10)]
        deadline = time.monotonic() + 30
        while not all(map(os.path.exists, started)) and time.monotonic() < deadline:
            time.sleep(0.05)  # SIGTERM once all ten runs are executing in their boxes
        assert all(map(os.path.exists, started))
    finally:
        _term(proc)
    for t in threads:
        t.join()
    # in-flight runs finish inside the drain deadline (20 s here), with their real output
    assert sorted(results) == list(range(10))
    for i, r in results.items():
        assert isinstance(r, httpx.Response) and r.status_code == 200, r
        assert r.json()["stdout"] == f"{i}\n"
    assert _bwraps_under(os.path.join(base, "ws")) == []
    proc, url = _serve(env)
    try:
        _wait_ready(proc, url)
        c = httpx.Client(base_url=url, headers=auth, timeout=60)
        for i in range(10):
            r = c.post("/v1/sandbox/read", json={"session_id": f"d{i}", "path": "n"})
            assert r.status_code == 200 and r.json()["content"] == str(i), r.text
    finally:
        _term(proc)


def test_a_run_cut_off_by_sigkill_is_audited_as_interrupted_at_the_next_start(jail_provider) -> None:
    """Its code ran, so it is on record: filed when it started, audited `interrupted` when the
    replica comes back. A run that finished leaves nothing filed."""
    from execbox.service.logs import code_hash

    base = traversable_tmpdir("execbox-cut-")
    env, auth = _env(base), _token(base)
    data = os.path.join(base, "data")
    code = "import time\nprint('started', flush=True)\ntime.sleep(300)"
    proc, url = _serve(env)
    try:
        _wait_ready(proc, url)
        c = httpx.Client(base_url=url, headers=auth, timeout=90)
        assert c.post("/v1/sandbox/execute", json={"session_id": "done", "code": "print(1)"}).status_code == 200
        with c.stream("POST", "/v1/sandbox/execute",
                      json={"session_id": "cut", "code": code, "timeout": 300, "stream": True}) as r:
            events = iter_events(r.iter_lines())  # held: a dropped generator closes the stream (a cancel)
            first = next(events)
            assert first == ("stdout", {"text": "started\n"}), first  # its code is running
            time.sleep(0.5)  # the audit writer's batch (50 ms)
            proc.kill()  # no drain, no final audit rows
    finally:
        _kill_now(proc)
    with open_store(data_dir=data) as store:
        runs = [(r["session_id"], r["status"]) for r in store.audit.list(tenant_id="t1")
                if r["operation"] == "execute_code"]
        assert runs == [("done", "success")]  # "cut" has no row yet

    proc, url = _serve(env)
    try:
        _wait_ready(proc, url)
        with open_store(data_dir=data) as store:
            rows = store.audit.list(tenant_id="t1")
            with store.engine.connect() as conn:
                left = conn.execute(text("select count(*) from audit_inflight")).scalar()
        cut = [r for r in rows if r["session_id"] == "cut" and r["operation"] == "execute_code"]
        assert len(cut) == 1 and cut[0]["status"] == "interrupted", rows
        assert cut[0]["code_hash"] == code_hash(code) and cut[0]["operation"] == "execute_code"
        assert cut[0]["token_id"] and cut[0]["provider"] == "jail"
        assert [r["status"] for r in rows if r["session_id"] == "done"] == ["success"]  # nothing filed was left
        assert left == 0
    finally:
        _term(proc)



def test_a_run_outlasting_the_drain_is_cancelled_and_answered(jail_provider) -> None:
    """A run still going when drain_timeout is over is cancelled and its request gets a real
    answer (the run reported cancelled), before the HTTP server's own deadline cuts requests off
    with a bare text 500; a request arriving during the drain is refused with SB009."""
    base = traversable_tmpdir("execbox-drain-")
    env, auth = {**_env(base), "EXECBOX_DRAIN_TIMEOUT": "2"}, _token(base)
    proc, url = _serve(env)
    result: dict[str, httpx.Response | Exception] = {}
    try:
        _wait_ready(proc, url)
        c = httpx.Client(base_url=url, headers=auth, timeout=60)
        assert c.post("/v1/sandbox/write", json={"session_id": "long", "path": "n", "content": "x"}).status_code == 200

        def run() -> None:
            try:
                result["r"] = httpx.post(f"{url}/v1/sandbox/execute", headers=auth, timeout=60, json={
                    "session_id": "long", "timeout": 60,
                    "code": "open('started', 'w').close()\nimport time\ntime.sleep(30)\nprint('finished')"})
            except Exception as e:  # noqa: BLE001
                result["r"] = e

        t = threading.Thread(target=run)
        t.start()
        ws = registry_workspaces(os.path.join(base, "ws"), os.path.join(base, "data"))
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(ws, "t1", "long", "started")) and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        t.join(60)
        took = time.monotonic() - started
    finally:
        _term(proc)
    r = result["r"]
    assert isinstance(r, httpx.Response), r
    assert r.headers["content-type"].startswith("application/json"), (r.status_code, r.text)
    body = r.json()
    assert r.status_code == 200 and "finished" not in body["stdout"] and body["metadata"].get("cancelled"), body
    assert took < 12, took  # drain_timeout (2 s) and the cancel, well before 30 s of sleep
