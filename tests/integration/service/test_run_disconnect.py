"""A plain (not streamed) execute or bash request whose client goes away cancels its run, as a
streamed one does (service/disconnect.py): the tenant's execution slot and the session are free
again long before the run's own timeout, and a client that gave up and retried is not met by 429.
On a replica set, a run forwarded to its session's owner is cancelled there too."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from urllib.parse import urlparse

import httpx
import pytest

from execbox.service.store import open_store
from tests.integration.store.conftest import new_pg_database, pg_server  # noqa: F401 - fixture

from .conftest import traversable_tmpdir
from .test_replicas import _replica
from .test_serve_cli import _wait_ready
from .test_session_restart import _term

pytestmark = pytest.mark.timeout(180)

RUN_TIMEOUT = 60  # the abandoned run's own: the slot must be free long before it


def _abandon(base_url: str, token: str, path: str, body: dict, probe: Callable[[], httpx.Response]) -> None:
    """Send the request, see its run hold the tenant's one slot (``probe`` answers 429), and close
    the connection unread. A probe can win the slot first, and the request then gets its 429: it
    is sent again."""
    url = urlparse(base_url)
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()
    for _ in range(10):
        with socket.create_connection((url.hostname, url.port)) as s:
            s.sendall(head + data)
            time.sleep(1)
            s.setblocking(False)
            try:
                answered = bool(s.recv(1))
            except BlockingIOError:
                answered = False
            if not answered and probe().status_code == 429:
                return  # its run holds the slot: now it is left
    raise AssertionError("the request to abandon never held the tenant's slot")


def _freed(probe: Callable[[], httpx.Response]) -> httpx.Response:
    left = time.monotonic()
    while (r := probe()).status_code == 429:
        assert time.monotonic() - left < RUN_TIMEOUT / 3, "the abandoned run still holds the tenant's slot"
        time.sleep(0.2)
    return r


@pytest.mark.parametrize("path, body", [
    ("/v1/sandbox/execute", {"code": "import time\ntime.sleep(600)", "timeout": RUN_TIMEOUT}),
    ("/bash", {"command": "sleep 600", "timeout": RUN_TIMEOUT, "session_id": "left"}),
])
def test_a_run_whose_client_left_is_cancelled(service_factory, path, body) -> None:
    svc = service_factory(tenant_max_executions=1)

    def probe() -> httpx.Response:
        return svc.a.post("/v1/sandbox/execute", json={"code": "print(1)"})

    _abandon(svc.url, svc.tenant_a, path, body, probe)
    r = _freed(probe)
    assert r.status_code == 200 and r.json()["stdout"] == "1\n", r.text
    if "session_id" in body:  # the session is usable again, not busy with the abandoned run
        r = svc.a.post("/v1/sandbox/bash", json={"command": "echo free", "session_id": "left"})
        assert r.status_code == 200 and r.json()["stdout"] == "free\n", r.text


def test_a_forwarded_run_whose_client_left_is_cancelled_on_its_owner(pg_server) -> None:  # noqa: F811
    db = new_pg_database(pg_server)
    base = traversable_tmpdir("execbox-disconnect-")
    with open_store(data_dir=os.path.join(base, "data-setup"), url=db) as store:
        _, token = store.tokens.create("t1")
    one_slot = {"SANDBOX_TENANT_MAX_EXECUTIONS": "1"}
    (pa, ua), (pb, ub) = _replica(base, db, "ra", **one_slot), _replica(base, db, "rb", **one_slot)
    try:
        _wait_ready(pa, ua)
        _wait_ready(pb, ub)
        a = httpx.Client(base_url=ua, headers={"Authorization": f"Bearer {token}"}, timeout=60)
        assert a.post("/v1/sandbox/bash", json={"command": "true", "session_id": "s"}).status_code == 200

        def probe() -> httpx.Response:  # on the owner, where the forwarded run holds the slot
            return a.post("/v1/sandbox/execute", json={"code": "print(1)"})

        # sent to rb, which forwards it to ra, the session's owner
        _abandon(ub, token, "/v1/sandbox/bash", {"command": "sleep 600", "timeout": RUN_TIMEOUT, "session_id": "s"},
                 probe)
        assert _freed(probe).status_code == 200
        r = a.post("/v1/sandbox/bash", json={"command": "echo free", "session_id": "s"})
        assert r.status_code == 200 and r.json()["stdout"] == "free\n", r.text
    finally:
        for p in (pa, pb):
            if p.poll() is None:
                _term(p)
