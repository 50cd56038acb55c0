"""A session's running run interrupted by another request, as a notebook's interrupt button:
the client that started the run gets it back as cancelled, a context's cell keeps its state
(review 29, finding 6: only the run's own client could stop it, by going away)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from .conftest import Service, error_of

pytestmark = pytest.mark.jail


def _interrupt(client, session: str, tenant: str = "tenant-a"):  # noqa: ANN001, ANN202
    return client.post(f"/v1/sandbox/sessions/{tenant}/{session}/interrupt")


def test_another_request_interrupts_the_running_cell_and_the_context_stays(service: Service) -> None:
    c, s = service.a, {"session_id": "intr", "context_id": "nb"}
    assert c.post("/v1/sandbox/execute", json={**s, "code": "rows = 41"}).status_code == 200
    assert _interrupt(c, "intr").json()["interrupted"] is False  # nothing runs
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(c.post, "/v1/sandbox/execute",
                          json={**s, "code": "print('busy', flush=True)\nwhile True:\n    pass", "timeout": 120})
        deadline = time.monotonic() + 60
        while True:  # until the run holds the session (an interrupt before it finds nothing)
            r = _interrupt(service.root, "intr")  # an admin, not the run's client
            assert r.status_code == 200, r.text
            if r.json()["interrupted"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.json() == {"tenant_id": "tenant-a", "session_id": "intr", "interrupted": True}
        body = run.result(timeout=60).json()
    assert body["metadata"].get("cancelled") is True and "KeyboardInterrupt" in body["stderr"], body
    assert "its state is kept" in body["metadata"]["context_note"], body["metadata"]
    r = c.post("/v1/sandbox/execute", json={**s, "code": "print(rows + 1)"})
    assert r.json()["stdout"] == "42\n", r.text


def test_interrupt_is_refused_to_other_tenants_and_never_creates_a_session(service: Service) -> None:
    service.a.post("/v1/sandbox/execute", json={"session_id": "intr2", "code": "1"}).raise_for_status()
    r = _interrupt(service.b, "intr2")
    assert r.status_code == 403 and error_of(r)["code"] == "SB002", r.text
    r = _interrupt(service.a, "never-made")
    assert r.status_code == 404 and error_of(r)["code"] == "SB002", r.text
    r = service.root.get("/v1/sandbox/sessions/tenant-a/never-made")
    assert r.status_code == 404, r.text


def test_the_remote_sdks_interrupt_a_run_from_another_thread(service: Service) -> None:
    import asyncio

    from execbox import AsyncRemoteSandbox, RemoteSandbox

    with RemoteSandbox(service.url, service.tenant_a, session_id="intrsdk") as sb:
        sb.run_code("kept = 'yes'", context_id="c")
        assert sb.interrupt() is False
        with ThreadPoolExecutor(1) as pool:
            run = pool.submit(sb.run_code, "while True:\n    pass", context_id="c", timeout=120)
            deadline = time.monotonic() + 60
            while not sb.interrupt() and time.monotonic() < deadline:
                time.sleep(0.2)
            r = run.result(timeout=60)
        assert r.metadata.get("cancelled") is True, r.metadata
        assert sb.run_code("print(kept)", context_id="c").stdout == "yes\n"

    async def go() -> bool:
        async with AsyncRemoteSandbox(service.url, service.tenant_a, session_id="intrasync") as sb:
            await sb.run_code("1")
            return await sb.interrupt()

    assert asyncio.run(go()) is False
