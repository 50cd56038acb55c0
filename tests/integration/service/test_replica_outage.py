"""A database outage with real `execbox serve` replicas on a real PostgreSQL (jail): while a
replica is fenced (its heartbeat hangs on a locked ``sessions`` table, so the store itself still
answers a ping) its /readyz is 503, and a run the fence cut off says ``cancelled_reason:
fenced``; when the database comes back for one replica first, that replica re-adopts only its
own sessions, not those of the replica still cut off, which gets its own back when it can log in
again (each replica connects as its own database role)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable

import httpx
import psycopg

from execbox.service.store import open_store
from tests.integration.store.conftest import new_pg_database, pg_server  # noqa: F401 - fixture

from .conftest import traversable_tmpdir
from .test_replicas import _replica
from .test_serve_cli import _wait_ready
from .test_session_restart import _term


def _until(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.2)


def _ready(url: str) -> tuple[int, dict]:
    try:
        r = httpx.get(f"{url}/readyz", timeout=5)
    except httpx.HTTPError:
        return 0, {}
    return r.status_code, r.json()


def _owners(admin_url: str) -> dict[str, str | None]:
    with psycopg.connect(admin_url) as conn:
        return {sid: owner for sid, owner in conn.execute("SELECT session_id, owner FROM sessions")}


def test_a_fenced_replica_is_not_ready_and_after_an_outage_takes_back_only_its_own_sessions(
        pg_server) -> None:  # noqa: F811
    db = new_pg_database(pg_server)
    admin = db.replace("postgresql+psycopg", "postgresql")
    base = traversable_tmpdir("execbox-outage-")
    with open_store(data_dir=os.path.join(base, "data-setup"), url=db) as store:
        _, token = store.tokens.create("t1")
    auth = {"Authorization": f"Bearer {token}"}
    role = {name: f"{name}_{uuid.uuid4().hex[:8]}" for name in ("ra", "rb")}
    with psycopg.connect(admin, autocommit=True) as conn:
        for r in role.values():
            conn.execute(f'CREATE ROLE "{r}" LOGIN SUPERUSER')
    lease = {"EXECBOX_SESSION_LEASE": "3"}
    (pa, ua), (pb, ub) = [_replica(base, db.replace("//postgres@", f"//{role[n]}@"), n, True, **lease)
                          for n in ("ra", "rb")]
    lock = psycopg.connect(admin)
    try:
        _wait_ready(pa, ua)
        _wait_ready(pb, ub)
        a = httpx.Client(base_url=ua, headers=auth, timeout=60)
        b = httpx.Client(base_url=ub, headers=auth, timeout=60)
        for client, sid in ((a, "s1"), (a, "s2"), (b, "s3"), (b, "s4")):
            r = client.post("/v1/sandbox/bash", json={"session_id": sid, "command": "true"})
            assert r.status_code == 200, r.text
        assert _owners(admin) == {"s1": "ra", "s2": "ra", "s3": "rb", "s4": "rb"}

        answer: list[httpx.Response] = []
        run = threading.Thread(target=lambda: answer.append(a.post("/v1/sandbox/bash", json={
            "session_id": "s2", "command": "echo started; sleep 30", "timeout": 60})))
        run.start()
        time.sleep(1)
        # heartbeats hang on the locked table (the store still answers): both replicas fence
        lock.execute("LOCK TABLE sessions IN ACCESS EXCLUSIVE MODE")
        for url in (ua, ub):
            _until(f"{url} says it is fenced", lambda url=url: _ready(url)[0] == 503 and "sessions" in
                   _ready(url)[1].get("error", {}).get("details", {}).get("reasons", {}))
        run.join(timeout=30)  # the fence cancelled the run in flight, and says so
        assert answer and answer[0].status_code == 200, answer
        meta = answer[0].json()["metadata"]
        assert meta.get("cancelled") is True and meta.get("cancelled_reason") == "fenced", meta
        # rb is cut off for good (its role may not log in), then the table is free again for ra
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'ALTER ROLE "{role["rb"]}" NOLOGIN')
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                         (role["rb"],))
        time.sleep(3.5)  # a whole lease with nobody renewing: every lease has run out
        lock.rollback()
        _until("ra serves again", lambda: _ready(ua)[0] == 200 and _ready(ua)[0] == 200)
        r = a.post("/v1/sandbox/bash", json={"session_id": "s1", "command": "echo back"})
        assert r.status_code == 200 and r.json()["stdout"] == "back\n", r.text
        time.sleep(1.5)  # a few more of ra's heartbeats
        assert _owners(admin) == {"s1": "ra", "s2": "ra", "s3": "rb", "s4": "rb"}  # rb's stay rb's

        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'ALTER ROLE "{role["rb"]}" LOGIN')
        _until("rb serves again", lambda: _ready(ub)[0] == 200)
        r = b.post("/v1/sandbox/bash", json={"session_id": "s3", "command": "echo mine"})
        assert r.status_code == 200 and r.json()["stdout"] == "mine\n", r.text
        assert "x-execbox-served-by" not in r.headers  # served by rb itself, not forwarded to ra
        assert _owners(admin) == {"s1": "ra", "s2": "ra", "s3": "rb", "s4": "rb"}
    finally:
        lock.close()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'ALTER ROLE "{role["rb"]}" LOGIN')
        for p in (pa, pb):
            if p.poll() is None:
                _term(p)
