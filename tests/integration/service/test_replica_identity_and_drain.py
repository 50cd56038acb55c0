"""Replica identity and the end of a replica, with real `execbox serve` replicas on a real
PostgreSQL (jail): a second process with a live replica's EXECBOX_REPLICA_ID is refused (SB002)
while a restart after a kill -9 is not; a long run counts as a use at its end in the registry's
``last_used``; a run the service cut off (session closed, replica drained) says why in
``metadata.cancelled_reason``; a drained replica's sessions are taken over on their next use at once (and those
nobody used are re-adopted by the restarted replica); a dead owner's "served by replica" answer
tells when its lease ends in Retry-After."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable

import httpx
import psycopg

from execbox.service.store import open_store
from tests.integration.store.conftest import new_pg_database, pg_server  # noqa: F401 - fixture

from .conftest import error_of, traversable_tmpdir
from .test_replicas import _replica
from .test_serve_cli import _wait_ready
from .test_session_restart import _term


def _setup(prefix: str, pg: str) -> tuple[str, str, dict[str, str]]:
    db = new_pg_database(pg)
    base = traversable_tmpdir(prefix)
    with open_store(data_dir=os.path.join(base, "data-setup"), url=db) as store:
        _, token = store.tokens.create("t1")
    return db, base, {"Authorization": f"Bearer {token}"}


def _row(db: str, session_id: str) -> tuple[str | None, float, float]:
    """(owner, lease_expires, last_used) of a session's registry row."""
    with psycopg.connect(db.replace("postgresql+psycopg", "postgresql")) as conn:
        row = conn.execute("SELECT owner, lease_expires, last_used FROM sessions WHERE session_id = %s",
                           (session_id,)).fetchone()
    assert row is not None, session_id
    return row[0], float(row[1] or 0.0), float(row[2])


def _cut_off(stop: Callable[[], object], run: Callable[[], httpx.Response]) -> httpx.Response:
    """``run`` in a thread; ``stop`` once it is under way: the run's answer (cancelled, 200)."""
    answer: list[httpx.Response] = []
    t = threading.Thread(target=lambda: answer.append(run()))
    t.start()
    time.sleep(1.5)
    stop()
    t.join(timeout=60)
    assert answer and answer[0].status_code == 200, answer
    assert answer[0].json()["metadata"].get("cancelled") is True, answer[0].text
    return answer[0]


def test_a_duplicated_replica_id_is_refused_and_a_restart_after_a_crash_is_not(pg_server) -> None:  # noqa: F811
    db, base, auth = _setup("execbox-dup-id-", pg_server)
    pa, ua = _replica(base, db, "ra", True)
    procs = [pa]
    try:
        _wait_ready(pa, ua)
        a = httpx.Client(base_url=ua, headers=auth, timeout=60)
        began = time.time()
        r = a.post("/v1/sandbox/bash", json={"session_id": "s", "command": "sleep 3; echo done"})
        assert r.status_code == 200 and r.json()["stdout"] == "done\n", r.text
        # the end of the run is its last use (flushed by a heartbeat), not its start
        deadline = time.monotonic() + 10
        while _row(db, "s")[2] < began + 2.5 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _row(db, "s")[2] >= began + 2.5, (_row(db, "s"), began)

        dup, _ = _replica(base, db, "ra", False)  # another process claiming ra's id while ra lives
        procs.append(dup)
        try:
            _, err = dup.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError("a second replica with a live replica's id was not refused") from None
        assert dup.returncode != 0 and "SB002" in err and "EXECBOX_REPLICA_ID" in err, err
        assert a.post("/v1/sandbox/bash", json={"session_id": "s", "command": "true"}).status_code == 200
        r = _cut_off(lambda: a.post("/v1/sandbox/sessions/t1/doomed/close"),
                     lambda: a.post("/v1/sandbox/bash", json={"session_id": "doomed", "command": "sleep 30"}))
        assert r.json()["metadata"].get("cancelled_reason") == "destroyed", r.text

        pa.kill()  # a crash, and the same replica started again at once: its heartbeat row is fresh
        pa.wait(timeout=30)
        pa2, ua2 = _replica(base, db, "ra", True)
        procs.append(pa2)
        _wait_ready(pa2, ua2)
        r = httpx.post(f"{ua2}/v1/sandbox/bash", headers=auth, timeout=60,
                       json={"session_id": "s", "command": "echo again"})
        assert r.status_code == 200 and r.json()["stdout"] == "again\n", r.text
    finally:
        for p in procs:
            if p.poll() is None:
                _term(p)


def test_a_drained_replicas_sessions_are_taken_over_at_once(pg_server) -> None:  # noqa: F811
    db, base, auth = _setup("execbox-drain-takeover-", pg_server)
    # a long lease: nothing here may wait for one to run out
    lease = {"EXECBOX_SESSION_LEASE": "30", "EXECBOX_DRAIN_TIMEOUT": "1"}
    (pa, ua), (pb, ub) = _replica(base, db, "ra", True, **lease), _replica(base, db, "rb", True, **lease)
    procs = [pa, pb]
    try:
        _wait_ready(pa, ua)
        _wait_ready(pb, ub)
        a = httpx.Client(base_url=ua, headers=auth, timeout=60)
        b = httpx.Client(base_url=ub, headers=auth, timeout=60)
        for sid in ("used", "untouched"):
            r = a.post("/v1/sandbox/write", json={"session_id": sid, "path": "f", "content": sid})
            assert r.status_code == 200, r.text
        r = _cut_off(lambda: _term(pa),  # a graceful drain: its boxes stop, its leases end now
                     lambda: a.post("/v1/sandbox/bash", json={"session_id": "untouched", "command": "sleep 30"}))
        assert r.json()["metadata"].get("cancelled_reason") == "draining", r.text
        r = b.post("/v1/sandbox/bash", json={"session_id": "used", "command": "cat f"})
        assert r.status_code == 200 and r.json()["stdout"] == "used", r.text
        assert "x-execbox-served-by" not in r.headers and _row(db, "used")[0] == "rb"

        pa2, ua2 = _replica(base, db, "ra", True, **lease)  # ra restarts: the one nobody used is its own again
        procs.append(pa2)
        _wait_ready(pa2, ua2)
        owner, lease_expires, _ = _row(db, "untouched")
        assert owner == "ra" and lease_expires > time.time(), (owner, lease_expires)

        pb.kill()  # rb dies with a 30 s lease on "used": ra cannot reach it and must wait for the lease
        pb.wait(timeout=30)
        r = httpx.post(f"{ua2}/v1/sandbox/bash", headers=auth, timeout=60,
                       json={"session_id": "used", "command": "true"})
        assert r.status_code == 503, r.text
        err = error_of(r)
        assert err["code"] == "SB009" and err["details"]["owner"] == "rb", err
        wait = int(r.headers["retry-after"])
        assert 1 < wait <= 30 and abs(wait - (err["details"]["lease_expires"] - time.time())) < 5, (wait, err)
    finally:
        for p in procs:
            if p.poll() is None:
                _term(p)
