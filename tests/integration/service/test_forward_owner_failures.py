"""Forwarding to an owner that cannot answer, with real `execbox serve` replicas on a real
PostgreSQL (jail): an owner whose connect times out was never reached (the plain "served by
replica" SB009 with Retry-After, nothing ran); a frozen owner (SIGSTOP) does not hold a forwarded
request past its lease (503 SB009 ``owner_lost_mid_request`` with Retry-After), and the takeover
that follows says the previous owner's box still holds the workspace (SB009, not SB004 "no
capacity") until that owner, woken, has fenced itself."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from execbox.service.store import open_store
from tests.integration.store.conftest import new_pg_database, pg_server  # noqa: F401 - fixture

from .conftest import error_of, traversable_tmpdir
from .test_replicas import _replica
from .test_serve_cli import _wait_ready
from .test_session_restart import _term


@contextmanager
def _blackhole() -> Iterator[str]:
    """A URL whose connects time out: a listener that never accepts, its accept queue full, so
    the kernel drops further SYNs (as a firewall dropping packets to a live owner would)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    addr = srv.getsockname()
    fillers = []
    for _ in range(3):
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(addr)
        fillers.append(c)
    time.sleep(0.2)
    try:
        socket.create_connection(addr, timeout=1).close()
        raise AssertionError("the blackhole listener accepted a connection")
    except TimeoutError:
        pass
    try:
        yield f"http://127.0.0.1:{addr[1]}"
    finally:
        for c in fillers:
            c.close()
        srv.close()


def _setup(prefix: str, pg: str) -> tuple[str, str, dict[str, str]]:
    db = new_pg_database(pg)
    base = traversable_tmpdir(prefix)
    with open_store(data_dir=os.path.join(base, "data-setup"), url=db) as store:
        _, token = store.tokens.create("t1")
    return db, base, {"Authorization": f"Bearer {token}"}


def test_an_owner_whose_connect_times_out_was_not_reached(pg_server) -> None:  # noqa: F811
    db, base, auth = _setup("execbox-fwd-timeout-", pg_server)
    with _blackhole() as unreachable:
        # ra is alive and heartbeating, but the URL the others reach it by drops every connect
        (pa, ua), (pb, ub) = (_replica(base, db, "ra", True, EXECBOX_REPLICA_URL=unreachable),
                              _replica(base, db, "rb", True))
        try:
            _wait_ready(pa, ua)
            _wait_ready(pb, ub)
            a = httpx.Client(base_url=ua, headers=auth, timeout=60)
            b = httpx.Client(base_url=ub, headers=auth, timeout=60)
            r = a.post("/v1/sandbox/write", json={"session_id": "s", "path": "a.txt", "content": "v0"})
            assert r.status_code == 200, r.text
            r = b.post("/v1/sandbox/write", json={"session_id": "s", "path": "a.txt", "content": "v1"})
            assert r.status_code == 503, r.text
            err = error_of(r)
            assert err["code"] == "SB009" and "served by replica ra" in err["message"], err
            assert err["details"].get("reason") != "owner_lost_mid_request", err
            assert err["details"]["owner"] == "ra"
            assert int(r.headers["retry-after"]) >= 1  # nothing ran: retrying is safe
            r = a.post("/v1/sandbox/read", json={"session_id": "s", "path": "a.txt"})
            assert r.status_code == 200 and r.json()["content"] == "v0", r.text
        finally:
            for p in (pa, pb):
                if p.poll() is None:
                    _term(p)


def test_a_frozen_owner_does_not_hold_a_forwarded_request_past_its_lease(pg_server) -> None:  # noqa: F811
    db, base, auth = _setup("execbox-fwd-frozen-", pg_server)
    lease = {"EXECBOX_SESSION_LEASE": "4"}
    (pa, ua), (pb, ub) = _replica(base, db, "ra", True, **lease), _replica(base, db, "rb", True, **lease)
    stopped = False
    try:
        _wait_ready(pa, ua)
        _wait_ready(pb, ub)
        a = httpx.Client(base_url=ua, headers=auth, timeout=60)
        b = httpx.Client(base_url=ub, headers=auth, timeout=60)
        r = a.post("/v1/sandbox/write", json={"session_id": "s", "path": "f", "content": "kept"})
        assert r.status_code == 200, r.text
        pa.send_signal(signal.SIGSTOP)  # frozen: its listen backlog still accepts the connection
        stopped = True
        # forwarded to ra while its lease is live; without a watch on the lease this hangs until SIGCONT
        r = b.post("/v1/sandbox/bash", json={"session_id": "s", "command": "echo hi"})
        assert r.status_code == 503, r.text
        err = error_of(r)
        assert err["code"] == "SB009" and err["details"]["reason"] == "owner_lost_mid_request", err
        assert err["details"].get("lease_expired") is True
        assert int(r.headers["retry-after"]) >= 1

        # the retry takes the session over, but the frozen owner's box still holds the workspace
        r = b.post("/v1/sandbox/bash", json={"session_id": "s", "command": "echo hi"})
        assert r.status_code == 503, r.text
        err = error_of(r)
        assert err["code"] == "SB009", err  # not SB004: capacity is not the problem
        assert err["details"]["reason"] == "previous_owner_holds_workspace", err
        assert int(r.headers["retry-after"]) >= 1

        pa.send_signal(signal.SIGCONT)  # woken, ra finds its lease over, fences, and stops its box
        stopped = False
        deadline = time.monotonic() + 30
        while True:
            r = b.post("/v1/sandbox/bash", json={"session_id": "s", "command": "cat f"})
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            assert error_of(r)["details"].get("reason") in ("previous_owner_holds_workspace", None), r.text
            time.sleep(0.3)
        assert r.status_code == 200 and r.json()["stdout"] == "kept", r.text
        assert b.get("/v1/sandbox/sessions/t1/s").json()["owner"] == "rb"
    finally:
        if stopped:
            pa.send_signal(signal.SIGCONT)
        for p in (pa, pb):
            if p.poll() is None:
                _term(p)
