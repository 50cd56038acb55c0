"""The service side of egress: session policy GET/PUT, tenant caps, audit API, metrics."""

from __future__ import annotations

import time

import pytest

from execbox.errors import InvalidConfigError
from tests.integration.service.conftest import error_of, start_service

from .conftest import jail_with
from .test_jail_egress import PY_FETCH


@pytest.fixture(scope="module")
def svc(fakenet):
    p = jail_with("allowlist", [fakenet.name("www"), fakenet.name("api")])
    s = start_service(p)
    yield s
    s.stop()
    p.shutdown()


def fetch(client, session, url):
    r = client.post("/v1/sandbox/execute", json={"code": PY_FETCH, "session_id": session, "timeout": 30,
                                                 "arguments": {"url": url}})
    assert r.status_code == 200, r.text
    return r.json()


def test_session_policy_narrowing_and_audit(svc, fakenet):
    www = fakenet.name("www")
    out = fetch(svc.a, "net1", f"http://{www}/")
    assert out["result"]["status"] == 200 and out["metadata"]["network"]["network"] == "allowlist"
    r = svc.a.get("/v1/sandbox/sessions/tenant-a/net1/network")
    assert r.status_code == 200 and r.json()["network"]["network"] == "allowlist", r.text
    r = svc.b.get("/v1/sandbox/sessions/tenant-a/net1/network")
    assert r.status_code == 403
    r = svc.a.put("/v1/sandbox/sessions/tenant-a/net1/network", json={"network": "open"})
    assert r.status_code == 403 and "wider" in error_of(r)["message"]
    r = svc.a.put("/v1/sandbox/sessions/tenant-a/net1/network",
                  json={"network": "allowlist", "allow": ["https://evil.example/x"]})
    err = error_of(r)
    assert r.status_code == 400 and err["code"] == "SB002" and err["details"]["entry"] == "https://evil.example/x"
    assert svc.a.get("/v1/sandbox/sessions/tenant-a/net1/network").json()["network"]["network"] == "allowlist"
    r = svc.a.put("/v1/sandbox/sessions/tenant-a/net1/network", json={"network": "allowlist", "allow": [f"{www}:443"]})
    assert r.status_code == 200 and r.json()["network"]["allow"] == [f"{www}:443"]
    assert fetch(svc.a, "net1", f"http://{www}/")["result"]["status"] == 403  # same box, narrower now
    sessions = svc.root.get("/v1/sandbox/sessions").json()["sessions"]
    assert any(s["session_id"] == "net1" and s["network"]["allow"] == [f"{www}:443"] for s in sessions)

    r = svc.a.get("/api/admin/egress/audit")
    assert r.status_code == 403
    deadline = time.monotonic() + 5  # a row is written once its connection has closed
    while True:
        q = {"tenant_id": "tenant-a", "session_id": "net1"}
        rows = svc.root.get("/api/admin/egress/audit", params=q).json()["data"]
        if any(x["decision"] == "denied" and x["port"] == 80 for x in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert any(x["decision"] == "allowed" and x["host"] == www and x["bytes_down"] > 0 for x in rows), rows
    assert any(x["decision"] == "denied" and x["port"] == 80 for x in rows), rows
    assert svc.root.get("/api/admin/egress/audit", params={"decision": "maybe"}).status_code == 400
    metrics = svc.client().get("/metrics").text
    assert 'execbox_egress_connections_total{decision="allowed",kind="tcp"}' in metrics
    assert "execbox_egress_audit_dropped_total 0.0" in metrics  # the store got every record


def test_tenant_cap(svc, fakenet):
    r = svc.root.put("/api/admin/egress/caps/tenant-b", json={"network": "allowlist", "allow": ["*.nowhere.test"]})
    assert r.status_code == 200, r.text
    bad = svc.root.put("/api/admin/egress/caps/tenant-b", json={"network": "allowlist", "allow": ["10.0.0.0/33"]})
    assert bad.status_code == 400 and error_of(bad)["details"]["entry"] == "10.0.0.0/33"
    assert svc.root.get("/api/admin/egress/caps").json()["caps"]["tenant-b"]["allow"] == ["*.nowhere.test:80|443"]
    out = fetch(svc.b, "capped", f"http://{fakenet.name('www')}/")
    assert not out["result"]["ok"], out  # provider allows www, the tenant's cap does not
    assert svc.b.get("/v1/sandbox/sessions/tenant-b/capped/network").json()["network"]["network"] == "none"
    r = svc.b.post("/v1/sandbox/execute", json={"code": PY_FETCH, "timeout": 30,  # one-shot: capped too
                                                "arguments": {"url": f"http://{fakenet.name('www')}/"}})
    assert r.status_code == 200 and not r.json()["result"]["ok"], r.text
    assert r.json()["metadata"]["network"]["network"] == "none"
    r = svc.b.put("/v1/sandbox/sessions/tenant-b/capped/network",
                  json={"network": "allowlist", "allow": [fakenet.name("www")]})
    assert r.status_code == 403
    assert svc.root.delete("/api/admin/egress/caps/tenant-b").json()["deleted"] is True


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "*", "example.com:70000", "https://example.com/api"])
def test_admin_config_refuses_bad_entries_and_keeps_secrets(svc, entry):
    r = svc.root.post("/api/admin/sandbox/config", json={"provider_type": "jail", "config": {
        "pool_size": 0, "network": "allowlist", "network_allow": [entry]}})
    err = error_of(r)
    assert r.status_code == 400 and err["code"] == "SB002", r.text
    assert entry in err["details"]["fields"]["network_allow"]
    assert svc.root.get("/api/admin/sandbox/config").status_code == 200


def test_admin_config_stores_credentials_encrypted(svc, fakenet):
    secret = "sk-admin-9c1e55aa77-STORED"
    api = fakenet.name("api")
    r = svc.root.post("/api/admin/sandbox/config", json={"provider_type": "jail", "config": {
        "pool_size": 0, "network": "allowlist", "network_allow": [api],
        "network_credentials": f'{{"{api}": {{"X-Api-Key": "{secret}"}}}}'}})
    assert r.status_code == 200, r.text
    shown = svc.root.get("/api/admin/sandbox/config").text
    assert secret not in shown and "****" in shown
    raw = svc.store.settings.get("sandbox.jail") or ""
    assert secret not in raw


def test_per_run_narrowing(svc, fakenet):
    www = fakenet.name("www")
    body = {"code": PY_FETCH, "session_id": "perrun", "timeout": 30, "arguments": {"url": f"http://{www}/"}}
    assert svc.a.post("/v1/sandbox/execute", json=body).json()["result"]["status"] == 200
    r = svc.a.post("/v1/sandbox/execute", json={**body, "network": {"network": "none"}})
    out = r.json()
    assert r.status_code == 200 and not out["result"]["ok"] and out["metadata"]["network"]["network"] == "none"
    r = svc.a.post("/v1/sandbox/execute", json={**body, "network": {"network": "open"}})
    assert r.status_code == 403, r.text
    r = svc.a.post("/v1/sandbox/execute", json={**body, "network": {"network": "allowlist", "allow": ["*"]}})
    assert r.status_code == 400 and error_of(r)["details"]["entry"] == "*"
    # the session's own policy is back after the narrowed run
    assert svc.a.post("/v1/sandbox/execute", json=body).json()["result"]["status"] == 200
    r = svc.a.post("/v1/sandbox/bash", json={"command": f"curl -sS -m 5 http://{www}/ >/dev/null; echo rc=$?",
                                             "network": {"network": "none"}})
    assert r.status_code == 200 and "rc=0" not in r.json()["stdout"], r.text


def test_box_cannot_reach_the_execbox_api(svc):
    from execbox.egress.policy import host_addresses

    port = int(svc.url.rsplit(":", 1)[1])
    targets = [f"http://127.0.0.1:{port}/healthz"] + [
        f"http://{ip}:{port}/healthz" for ip in sorted(host_addresses(), key=str) if not ip.is_loopback][:3]
    for url in targets:
        out = fetch(svc.a, "api-probe", url)
        assert out["result"].get("status") != 200, (url, out["result"])


def test_a_cap_lowered_under_a_narrowed_session_holds_when_its_box_is_started_again(svc, fakenet):
    """The session chose [www]; then the admin cut the tenant off. The session's next box gets the
    cap (none), not the provider's policy: applying the policy used to fail after the box was bound
    to the provider's, and the box stayed with it."""
    www, api = fakenet.name("www"), fakenet.name("api")
    assert fetch(svc.b, "recap", f"http://{www}/")["result"]["status"] == 200
    r = svc.b.put("/v1/sandbox/sessions/tenant-b/recap/network", json={"network": "allowlist", "allow": [www]})
    assert r.status_code == 200, r.text
    assert svc.root.put("/api/admin/egress/caps/tenant-b", json={"network": "none"}).status_code == 200
    try:
        assert svc.b.post("/v1/sandbox/sessions/tenant-b/recap/pause").status_code == 200
        for url in (f"http://{api}/", f"http://{www}/"):
            out = fetch(svc.b, "recap", url)  # the box starts again here
            assert not out["result"]["ok"] and out["metadata"]["network"]["network"] == "none", out
        assert svc.b.get("/v1/sandbox/sessions/tenant-b/recap/network").json()["network"]["network"] == "none"
    finally:
        svc.root.delete("/api/admin/egress/caps/tenant-b")


def test_a_box_whose_policy_cannot_be_applied_does_not_serve_the_session(svc, fakenet, monkeypatch):
    from execbox.service import egress_hook

    www = fakenet.name("www")

    def broken(_tenant):
        raise RuntimeError("settings store unavailable")

    monkeypatch.setattr(egress_hook, "caps_lookup", broken)
    r = svc.b.post("/v1/sandbox/execute", json={"code": PY_FETCH, "session_id": "nocap", "timeout": 30,
                                                "arguments": {"url": f"http://{www}/"}})
    assert r.status_code >= 500, r.text  # fails closed: no run on a box with the provider's policy
    monkeypatch.undo()
    assert svc.root.put("/api/admin/egress/caps/tenant-b", json={"network": "none"}).status_code == 200
    try:
        out = fetch(svc.b, "nocap", f"http://{www}/")
        assert not out["result"]["ok"] and out["metadata"]["network"]["network"] == "none", out
    finally:
        svc.root.delete("/api/admin/egress/caps/tenant-b")


@pytest.mark.parametrize(("name", "value"), [("EXECBOX_EGRESS_MAX_CONNECTIONS", "lots"),
                                             ("EXECBOX_EGRESS_MAX_CONNECTIONS", "0"),
                                             ("EXECBOX_EGRESS_MAX_BYTES", "1.5GB"),
                                             ("EXECBOX_EGRESS_INTERCEPT_IDLE", "forever")])
def test_a_bad_egress_cap_stops_the_start(fakenet, monkeypatch, name: str, value: str) -> None:
    """A cap the operator mistyped was once read as the default without a word; now it is SB002
    naming the variable when the service starts, before any box runs under a cap nobody chose."""
    monkeypatch.setenv(name, value)
    p = jail_with("allowlist", [fakenet.name("www")])
    try:
        with pytest.raises(InvalidConfigError, match=name) as ei:
            start_service(p)
        assert ei.value.code == "SB002"
    finally:
        p.shutdown()
