"""Production wiring: the active provider comes from the settings store and changes at runtime.

A switch made through the admin API reaches new sessions at once; sessions already open keep
their box (and files) on the provider they started on.
"""

from __future__ import annotations

from .conftest import Service


def test_admin_switch_reaches_new_sessions_and_spares_open_ones(service_factory) -> None:
    svc: Service = service_factory(provider=None)
    root = svc.root
    r = root.post("/api/admin/sandbox/config", json={"provider_type": "jail", "set_active": True,
                                                     "config": {"pool_size": 0, "preload": "none"}})
    assert r.status_code == 200, r.text
    first = svc.a.post("/v1/sandbox/execute", json={"code": "open('f','w').write('kept'); print(1)",
                                                    "session_id": "before"})
    assert first.status_code == 200 and first.json()["metadata"]["provider"] == "jail"

    r = root.post("/api/admin/sandbox/config", json={"provider_type": "local", "set_active": True,
                                                     "config": {"pool_size": 0}})
    assert r.status_code == 200, r.text
    fresh = svc.a.post("/v1/sandbox/execute", json={"code": "print(2)", "session_id": "after"}).json()
    assert fresh["metadata"]["provider"] == "local"
    once = svc.a.post("/v1/sandbox/execute", json={"code": "print(3)"}).json()
    assert once["metadata"]["provider"] == "local"
    old = svc.a.post("/v1/sandbox/execute", json={"code": "print(open('f').read())", "session_id": "before"})
    assert old.json()["stdout"] == "kept\n" and old.json()["metadata"]["provider"] == "jail"
    assert svc.client().get("/readyz").json()["provider"] == "local"
