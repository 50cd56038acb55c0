"""Background processes of a session owned by another replica: two real `execbox serve` replicas
on one real PostgreSQL; every process request made to the other replica is forwarded to the owner,
which keeps the process and its output."""

from __future__ import annotations

import os
import time

import httpx

from execbox.service.store import open_store
from tests.integration.store.conftest import new_pg_database, pg_server  # noqa: F401 - fixture

from .conftest import traversable_tmpdir
from .test_replicas import _replica
from .test_serve_cli import _wait_ready
from .test_session_restart import _term


def test_process_requests_are_forwarded_to_the_owning_replica(pg_server) -> None:  # noqa: F811
    db = new_pg_database(pg_server)
    base = traversable_tmpdir("execbox-proc-replicas-")
    with open_store(data_dir=os.path.join(base, "data-setup"), url=db) as store:
        _, token = store.tokens.create("t1")
    auth = {"Authorization": f"Bearer {token}"}
    (pa, ua), (pb, ub) = _replica(base, db, "ra", log_to_file=True), _replica(base, db, "rb", log_to_file=True)
    try:
        _wait_ready(pa, ua)
        _wait_ready(pb, ub)
        a = httpx.Client(base_url=ua, headers=auth, timeout=60)
        b = httpx.Client(base_url=ub, headers=auth, timeout=60)
        path = "/v1/sandbox/sessions/t1/s/processes"
        r = a.post(path, json={"command": "read x; echo got-$x; sleep 0.5; echo done", "stdin": True})
        assert r.status_code == 201, r.text
        pid = r.json()["pid"]
        r = b.get(path)  # the list, through the other replica
        assert r.status_code == 200 and [p["pid"] for p in r.json()["processes"]] == [pid], r.text
        assert r.headers["x-execbox-served-by"] == ua
        r = b.post(f"{path}/{pid}/stdin", json={"data": "fwd\n"})
        assert r.status_code == 200 and r.headers["x-execbox-served-by"] == ua, r.text
        out, offset = "", 0
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline
            r = b.get(f"{path}/{pid}", params={"stdout_offset": offset, "wait": 5})  # a forwarded long-poll
            assert r.status_code == 200 and r.headers["x-execbox-served-by"] == ua, r.text
            out, offset = out + r.json()["stdout"], r.json()["stdout_offset"]
            if not r.json()["running"]:
                break
        assert out == "got-fwd\ndone\n" and r.json()["exit_code"] == 0
        r = b.post(path, json={"command": "sleep 60"})  # started through the other replica: on the owner
        assert r.status_code == 201 and r.headers["x-execbox-served-by"] == ua, r.text
        r = b.post(f"{path}/{r.json()['pid']}/signal", json={"signal": "SIGKILL"})
        assert r.status_code == 200 and r.json()["signalled"] is True, r.text
    finally:
        for p in (pa, pb):
            if p.poll() is None:
                _term(p)
