"""A provider without background processes (self_managed, over a real executor server) refuses
the HTTP API's process routes with 501 SB002 naming it, instead of pretending."""

from __future__ import annotations

from execbox.providers.self_managed import SelfManagedProvider
from tests.integration.service.conftest import start_service


def test_process_routes_name_a_provider_without_background_processes(executor_server) -> None:
    p = SelfManagedProvider()
    p.initialize({"endpoint": executor_server.url, "timeout": 10, "max_retries": 0})
    svc = start_service(p)
    try:
        a = svc.a
        r = a.post("/v1/sandbox/sessions/tenant-a/s/processes", json={"command": "sleep 1"})
        assert r.status_code == 501, r.text
        err = r.json()["error"]
        assert err["code"] == "SB002" and "self_managed" in err["message"]
        assert err["details"] == {"provider": "self_managed", "reason": "background_processes_unsupported"}
        r = a.get("/v1/sandbox/sessions/tenant-a/s/processes")
        assert r.status_code == 501 and r.json()["error"]["details"]["provider"] == "self_managed"
    finally:
        svc.stop()
        p.shutdown()
