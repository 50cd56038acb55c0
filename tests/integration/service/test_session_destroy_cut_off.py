"""A session destroy cut off by `kill -9` of a real `execbox serve` (jail) is finished, not left
`closing` for ever (every use answered 503 "being destroyed; retry", its workspace kept); and an
admin DELETE of a session the replica has not loaded answers 200 with the `destroyed` object a
loaded one gets (it was a 500: response validation).

The crash is simulated deterministically: the service is killed with SIGKILL, then its session
row is given the state a kill during the destroy leaves (``closing``; the workspace still there),
before the service starts again on the same data."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from sqlalchemy import text

from execbox.boxes.jail_box import boxes_dir, reap_stale
from execbox.service.store import open_store
from tests.integration.store.conftest import new_pg_database, pg_server  # noqa: F401 - fixture

from .conftest import registry_workspaces, traversable_tmpdir
from .test_replicas import _replica as replica
from .test_serve_cli import _serve, _wait_ready
from .test_session_restart import _bwraps_under, _env, _term


def _setup(base: str, db: str | None) -> tuple[dict[str, str], str, str]:
    """(env, admin token, tenant t1 token) of a service on ``db`` (None: SQLite in the data dir)."""
    env = _env(base)
    if db is not None:
        env["EXECBOX_DATABASE_URL"] = db
    with open_store(data_dir=os.path.join(base, "data"), url=db) as store:
        _, admin = store.tokens.create("ops", role="admin")
        _, t1 = store.tokens.create("t1")
    return env, admin, t1


def _sql(base: str, db: str | None, q: str, **params: object) -> list[tuple]:
    with open_store(data_dir=os.path.join(base, "data"), url=db) as store:
        with store.engine.begin() as conn:
            res = conn.execute(text(q), params)
            return [tuple(r) for r in res] if res.returns_rows else []


def _workspaces(base: str, db: str | None) -> str:
    with open_store(data_dir=os.path.join(base, "data"), url=db) as store:
        return os.path.join(base, "ws", store.sessions.identity())


def _kill9(proc: subprocess.Popen) -> None:
    """SIGKILL: no drain, no final heartbeat; the jail boxes die with it (reaped here)."""
    proc.kill()
    proc.communicate(timeout=30)
    for pid in _bwraps_under(os.path.join(boxes_dir(), f"jail-{proc.pid}-")):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextlib.contextmanager
def _served(env: dict[str, str], stop: Callable[[subprocess.Popen], object] = _term) -> Iterator[str]:
    """A running `execbox serve` (its URL), stopped by ``stop`` (SIGTERM and the box check, or
    ``_kill9``) whatever the body did."""
    proc, url = _serve(env)
    try:
        _wait_ready(proc, url)
        yield url
    finally:
        stop(proc)


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


@pytest.fixture(params=["sqlite", "postgres"])
def db(request) -> str | None:
    if request.param == "sqlite":
        return None
    return new_pg_database(request.getfixturevalue("pg_server"))


def test_a_destroy_cut_off_by_kill9_is_finished_when_the_service_starts_again(jail_provider, db) -> None:
    base = traversable_tmpdir("execbox-cutdestroy-")
    env, admin, tok = _setup(base, db)
    with _served(env, _kill9) as url:
        c = _client(url, tok)
        for sid in ("d1", "keep"):
            r = c.post("/v1/sandbox/write", json={"session_id": sid, "path": "f.txt", "content": sid})
            assert r.status_code == 200, r.text
    ws = _workspaces(base, db)
    assert os.path.isdir(os.path.join(ws, "t1", "d1"))
    # what `kill -9` during DELETE /sessions/t1/d1 leaves: the row `closing`, the workspace on disk
    # (expires_at as an older version left it: none, so only the start can find it)
    _sql(base, db, "UPDATE sessions SET state = 'closing' WHERE tenant_id = 't1' AND session_id = 'd1'")

    with _served(env) as url:
        # finished before the first request: the row and the files the admin asked to delete are gone
        assert _sql(base, db, "SELECT session_id, state FROM sessions ORDER BY session_id") == [("keep", "running")]
        assert not os.path.exists(os.path.join(ws, "t1", "d1"))
        c, a = _client(url, tok), _client(url, admin)
        r = c.get("/v1/sandbox/sessions/t1/d1")
        assert r.status_code == 404 and r.json()["error"]["code"] == "SB002", r.text
        r = a.delete("/v1/sandbox/sessions/t1/d1")
        assert r.status_code == 404 and r.json()["error"]["code"] == "SB002", r.text
        r = c.post("/v1/sandbox/execute", json={"session_id": "d1",
                                                 "code": "import os\nprint(os.path.exists('f.txt'))"})
        assert r.status_code == 200 and r.json()["stdout"] == "False\n", r.text  # a fresh session
        r = c.post("/v1/sandbox/read", json={"session_id": "keep", "path": "f.txt"})
        assert r.status_code == 200 and r.json()["content"] == "keep", r.text  # the other one untouched


def _dead_replicas_closing_row(base: str, db: str | None, ws: str, session_id: str, owner: str) -> str:
    """A `closing` row of replica ``owner`` (its destroy cut off), its workspace still on disk and
    no ``expires_at`` (no sweep finds it): only a request can."""
    with open_store(data_dir=os.path.join(base, "data"), url=db) as store:
        store.sessions.create("t1", session_id, provider="jail", runtime=None, owner=owner, lease_ttl=0.01,
                              tenant_limit=100, global_limit=100)
        store.sessions.update("t1", session_id, state="closing", box_handle={"instance_id": f"t1:{session_id}:x"})
    path = os.path.join(ws, "t1", session_id)
    os.makedirs(path)
    with open(os.path.join(path, "f.txt"), "w") as f:
        f.write("left")
    return path


def test_requests_for_a_cut_off_destroy_finish_it_or_wait_for_its_live_destroyer(jail_provider) -> None:
    """While the service runs: a use of a session whose destroyer is gone finishes the destroy and
    gets 404 SB002 (then a fresh session), never 503 again and again; an admin DELETE of one
    answers 200 with the `destroyed` object; one whose destroyer still heartbeats is left to it
    (503, retry) until that replica is a lease late."""
    base = traversable_tmpdir("execbox-cutdestroy-")
    env, admin, tok = _setup(base, None)
    env["EXECBOX_SESSION_LEASE"] = "2"
    with _served(env) as url:
        c, a = _client(url, tok), _client(url, admin)
        assert c.post("/v1/sandbox/write", json={"session_id": "first", "path": "x", "content": "1"}).status_code == 200
        ws = registry_workspaces(os.path.join(base, "ws"), os.path.join(base, "data"))
        used = _dead_replicas_closing_row(base, None, ws, "used", "r-dead")
        deleted = _dead_replicas_closing_row(base, None, ws, "deleted", "r-dead")
        busy = _dead_replicas_closing_row(base, None, ws, "busy", "r-live")
        _sql(base, None, "INSERT INTO replicas (id, url, started_at, heartbeat) VALUES ('r-live', NULL, :t, :t)",
             t=time.time() + 3600)  # r-live heartbeats: its destroy is still under way

        r = c.post("/v1/sandbox/execute", json={"session_id": "used", "code": "print(1)"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "SB002", r.text
        assert not os.path.exists(used) and _sql(base, None, "SELECT 1 FROM sessions WHERE session_id = 'used'") == []
        r = c.post("/v1/sandbox/execute", json={"session_id": "used",
                                                 "code": "import os\nprint(os.path.exists('f.txt'))"})
        assert r.status_code == 200 and r.json()["stdout"] == "False\n", r.text

        r = a.delete("/v1/sandbox/sessions/t1/deleted")
        assert r.status_code == 200, r.text
        gone = r.json()["destroyed"]
        assert (gone["tenant_id"], gone["session_id"], gone["state"]) == ("t1", "deleted", "closed")
        assert gone["instance_id"] == "t1:deleted:x" and gone["provider"] == "jail"
        assert not os.path.exists(deleted)
        assert a.delete("/v1/sandbox/sessions/t1/deleted").status_code == 404

        for _ in range(2):  # its destroyer is alive: told to retry, its workspace left to it
            r = c.post("/v1/sandbox/execute", json={"session_id": "busy", "code": "print(1)"})
            assert r.status_code == 503 and r.json()["error"]["code"] == "SB009", r.text
            assert "being destroyed" in r.json()["error"]["message"] and r.headers.get("retry-after")
        r = a.delete("/v1/sandbox/sessions/t1/busy")
        assert r.status_code == 503 and os.path.exists(busy), r.text
        _sql(base, None, "UPDATE replicas SET heartbeat = :t WHERE id = 'r-live'", t=time.time() - 3)  # it died
        r = c.post("/v1/sandbox/execute", json={"session_id": "busy", "code": "print(1)"})
        assert r.status_code == 404, r.text
        assert not os.path.exists(busy)


def test_admin_delete_of_a_lost_session_answers_like_a_loaded_one(jail_provider) -> None:
    """A `lost` session (its workspace vanished while the service was down) is not loaded after the
    restart; its DELETE answered 500 SB000 (ResponseValidationError) although it destroyed it."""
    base = traversable_tmpdir("execbox-deletelost-")
    env, admin, tok = _setup(base, None)
    with _served(env) as url:
        c = _client(url, tok)
        for sid in ("gone", "live"):
            assert c.post("/v1/sandbox/write", json={"session_id": sid, "path": "f", "content": "x"}).status_code == 200
    ws = registry_workspaces(os.path.join(base, "ws"), os.path.join(base, "data"))
    shutil.rmtree(os.path.join(ws, "t1", "gone"))  # its disk is lost while the service is down
    with _served(env) as url:
        c, a = _client(url, tok), _client(url, admin)
        assert c.post("/v1/sandbox/execute", json={"session_id": "gone", "code": "1"}).status_code == 410
        assert c.post("/v1/sandbox/execute", json={"session_id": "live", "code": "1"}).status_code == 200
        loaded = a.delete("/v1/sandbox/sessions/t1/live")
        assert loaded.status_code == 200, loaded.text
        r = a.delete("/v1/sandbox/sessions/t1/gone")
        assert r.status_code == 200, r.text
        destroyed = r.json()["destroyed"]
        assert set(destroyed) == set(loaded.json()["destroyed"])  # the same object
        assert (destroyed["tenant_id"], destroyed["session_id"], destroyed["state"]) == ("t1", "gone", "closed")
        assert destroyed["instance_id"] and destroyed["provider"] == "jail" and destroyed["owner"] == "r-restart"
        assert a.delete("/v1/sandbox/sessions/t1/gone").status_code == 404


def test_an_e2b_kill_cut_off_by_kill9_ends_the_sandbox(jail_provider) -> None:
    """The service killed during an E2B kill (the sandbox's session row `closing`): after the restart
    the sandbox is gone (404, not listed), not `running` until its deadline with envd answering 503."""
    base = traversable_tmpdir("execbox-e2bcut-")
    env, _admin, tok = _setup(base, None)
    with _served(env, _kill9) as url:
        r = httpx.post(f"{url}/sandboxes", headers={"X-API-Key": tok}, json={"templateID": "base", "timeout": 3600},
                       timeout=120)
        assert r.status_code == 201, r.text
        sbx = r.json()
        envd = {"E2b-Sandbox-Id": sbx["sandboxID"], "E2b-Sandbox-Port": "49983",
                "X-Access-Token": sbx["envdAccessToken"]}
        r = httpx.post(f"{url}/files", params={"path": "/home/user/f.txt"}, content=b"hello", timeout=60,
                       headers={**envd, "Content-Type": "application/octet-stream"})
        assert r.status_code == 200, r.text
    sid = sbx["sandboxID"]
    _sql(base, None, "UPDATE sessions SET state = 'closing' WHERE session_id = :s", s=f"e2b-{sid}")

    with _served(env) as url:
        assert _sql(base, None, "SELECT session_id FROM sessions") == []
        r = httpx.get(f"{url}/sandboxes/{sid}", headers={"X-API-Key": tok}, timeout=30)
        assert r.status_code == 404, r.text
        assert httpx.get(f"{url}/sandboxes", headers={"X-API-Key": tok}, timeout=30).json() == []
        r = httpx.get(f"{url}/files", params={"path": "/home/user/f.txt"}, headers=envd, timeout=30)
        assert r.status_code != 503 and b"hello" not in r.content, r.text
        assert _sql(base, None, "SELECT sandbox_id FROM e2b_sandboxes") == []


def _replica(base: str, db: str, name: str) -> tuple[subprocess.Popen, str]:
    return replica(base, db, name, log_to_file=True, SANDBOX_IDLE_TIMEOUT="8")  # a sweep every 2 s


def test_a_dead_replicas_cut_off_destroy_is_finished_by_another_replicas_sweep(pg_server) -> None:  # noqa: F811
    """Replica ra is killed during a destroy and never comes back: rb's sweep finishes it once ra's
    heartbeat is a lease old (not before: a live destroyer is left alone)."""
    db = new_pg_database(pg_server)
    base = traversable_tmpdir("execbox-cutreplica-")
    with open_store(data_dir=os.path.join(base, "data-setup"), url=db) as store:
        _, tok = store.tokens.create("t1")
    (pa, ua), (pb, ub) = _replica(base, db, "ra"), _replica(base, db, "rb")
    try:
        _wait_ready(pa, ua)
        _wait_ready(pb, ub)
        r = _client(ua, tok).post("/v1/sandbox/write", json={"session_id": "s", "path": "f", "content": "x"})
        assert r.status_code == 200, r.text
        with open_store(data_dir=os.path.join(base, "data-setup"), url=db) as store:
            ws = os.path.join(base, "ws", store.sessions.identity(), "t1", "s")
            assert store.sessions.get("t1", "s").owner == "ra" and os.path.isdir(ws)
            pa.kill()
            pa.wait(timeout=30)
            for pid in _bwraps_under(os.path.join(boxes_dir(), f"jail-{pa.pid}-")):
                os.kill(pid, signal.SIGKILL)
            now = time.time()  # what ra's destroy wrote before the kill (admin._mark_closing)
            store.sessions.update("t1", "s", state="closing", owner="ra", lease_expires=now + 2, expires_at=now + 2)
            deadline = time.monotonic() + 30
            while store.sessions.get("t1", "s") is not None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert store.sessions.get("t1", "s") is None, open(os.path.join(base, "rb.log")).read()[-3000:]
            finished = time.time() - now
        assert finished >= 2, finished  # not while ra could still have been tearing it down
        assert not os.path.exists(ws)
        r = _client(ub, tok).post("/v1/sandbox/read", json={"session_id": "s", "path": "f"})
        assert r.status_code == 404, r.text  # a fresh session: the file went with the destroyed one
    finally:
        for p in (pa, pb):
            if p.poll() is None:
                _term(p)
        reap_stale()  # ra's boxes, had the test failed before rb removed them (as a start would)
