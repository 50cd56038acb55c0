"""Production wiring: the active provider comes from the settings store and changes at runtime.

A switch made through the admin API reaches new sessions at once; sessions already open keep
their box (and files) on the provider they started on.
"""

from __future__ import annotations

from .conftest import Service, error_of, start_service


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


def test_a_public_service_refuses_a_provider_without_isolation_at_runtime_too() -> None:
    """`execbox serve` on a non-loopback address refuses `local` at start; the same refusal holds
    when the admin API, a fallback list or `execbox config activate` (a store write) would switch
    to it later: nothing runs as the service's own user."""
    svc = start_service(None, no_isolation_refused="the service listens on 192.0.2.2")
    try:
        root = svc.root
        r = root.post("/api/admin/sandbox/config", json={"provider_type": "jail", "set_active": True,
                                                         "config": {"pool_size": 0, "preload": "none"}})
        assert r.status_code == 200, r.text
        assert svc.a.post("/v1/sandbox/execute", json={"code": "print(1)"}).json()["stdout"] == "1\n"
        for method, path, body in (
                ("POST", "/api/admin/sandbox/config", {"provider_type": "local", "set_active": True,
                                                       "config": {"pool_size": 0}}),
                ("PUT", "/api/admin/sandbox/active", {"provider": "local"}),
                ("PUT", "/api/admin/sandbox/fallback", {"providers": ["local"]})):
            r = root.request(method, path, json=body)
            assert r.status_code == 400, (path, r.text)
            err = error_of(r)
            assert err["code"] == "SB002" and "--allow-no-isolation" in err["message"], err
        assert root.get("/api/admin/sandbox/status").json()["serving"]["provider"] == "jail"

        # a store write behind the API's back (what `execbox config activate local` does)
        svc.app.state.services.sandbox_settings.save("local", {"pool_size": 0}, set_active=True)
        r = svc.a.post("/v1/sandbox/execute", json={"code": "import os; print(os.getuid())"})
        assert r.status_code == 503, r.text
        err = error_of(r)
        assert err["code"] == "SB009" and "no isolation" in err["message"] and "stdout" not in r.json()
    finally:
        svc.stop()
