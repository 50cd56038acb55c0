"""A plain (not streamed) execute or bash request whose client goes away cancels its run, as a
streamed one does (service/disconnect.py): the tenant's execution slot and the session are free
again long before the run's own timeout, and a client that gave up and retried is not met by 429."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import pytest

from .conftest import Service

pytestmark = pytest.mark.timeout(120)

RUN_TIMEOUT = 60  # the abandoned run's own: the slot must be free long before it


def _abandon(svc: Service, path: str, body: dict) -> None:
    """Send the request, see its run hold the tenant's one slot, and close the connection unread.
    A probe run can win the slot first, and the request then gets its 429: it is sent again."""
    url = urlparse(svc.url)
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {svc.tenant_a}\r\n"
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
            if not answered and _next_run(svc).status_code == 429:
                return  # its run holds the slot: now it is left
    raise AssertionError("the request to abandon never held the tenant's slot")


def _next_run(svc: Service):
    return svc.a.post("/v1/sandbox/execute", json={"code": "print(1)"})


@pytest.mark.parametrize("path, body", [
    ("/v1/sandbox/execute", {"code": "import time\ntime.sleep(600)", "timeout": RUN_TIMEOUT}),
    ("/bash", {"command": "sleep 600", "timeout": RUN_TIMEOUT, "session_id": "left"}),
])
def test_a_run_whose_client_left_is_cancelled(service_factory, path, body) -> None:
    svc = service_factory(tenant_max_executions=1)
    _abandon(svc, path, body)
    left = time.monotonic()
    while (r := _next_run(svc)).status_code == 429:
        assert time.monotonic() - left < RUN_TIMEOUT / 3, "the abandoned run still holds the tenant's slot"
        time.sleep(0.2)
    assert r.status_code == 200 and r.json()["stdout"] == "1\n", r.text
    if "session_id" in body:  # the session is usable again, not busy with the abandoned run
        r = svc.a.post("/v1/sandbox/bash", json={"command": "echo free", "session_id": "left"})
        assert r.status_code == 200 and r.json()["stdout"] == "free\n", r.text
