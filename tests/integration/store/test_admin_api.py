"""Admin API over the real service app, on SQLite and PostgreSQL: auth, CRUD, per-field
validation, redaction and secret round-trips, probes, active/fallback switching."""

from __future__ import annotations

import json
import socket
import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from execbox.service.app import create_app
from execbox.service.config import ServiceSettings
from execbox.service.crypto import is_encrypted
from execbox.service.provider_manager import ProviderManager
from execbox.service.store import open_store

from .helpers import keyring, write_seed

SECRET = "sk-live-0123456789abcdefWXYZ"
API = "/api/admin/sandbox"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def admin(db_url, tmp_path):
    store = open_store(tmp_path, url=db_url)
    providers = ProviderManager(store, keyring=keyring(), env={"SANDBOX_TYPE": "local"},
                               seed_file=write_seed(tmp_path))
    app = create_app(store=store, providers=providers, settings=ServiceSettings())
    _, admin_token = store.tokens.create("ops", "admin")
    _, tenant_token = store.tokens.create("acme")
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {admin_token}"
        client.tenant_headers = {"Authorization": f"Bearer {tenant_token}"}
        client.store = store
        client.providers = providers
        yield client
    providers.shutdown()
    store.close()


def stored_row(store, name: str) -> dict:
    with store.engine.connect() as conn:
        raw = conn.execute(text("SELECT value FROM system_settings WHERE name = :n"), {"n": name}).scalar()
    return json.loads(raw) if raw else None


ROUTES = [("get", "/providers", None), ("get", "/config", None), ("get", "/status", None),
          ("get", "/audit", None),
          ("post", "/config", {"provider_type": "local", "config": {}}),
          ("post", "/test", {"provider_type": "local", "config": {}}),
          ("put", "/active", {"provider": "local"}), ("get", "/fallback", None),
          ("put", "/fallback", {"providers": []})]


@pytest.mark.parametrize("method,path,body", ROUTES)
def test_every_admin_route_needs_an_admin_token(admin, method, path, body):
    kwargs = {"json": body} if body is not None else {}
    r = admin.request(method, API + path, headers={"Authorization": ""}, **kwargs)
    assert r.status_code == 401 and r.json()["error"]["code"] == "SB002"
    r = admin.request(method, API + path, headers=admin.tenant_headers, **kwargs)
    assert r.status_code == 403 and r.json()["error"]["code"] == "SB002"


def test_providers_list_describes_schema_tier_and_usability(admin):
    data = {p["id"]: p for p in admin.get(API + "/providers").json()["data"]}
    local = data["local"]
    assert local["isolation"] == "none" and local["usable"] is True and local["active"] is True
    assert local["config_schema"]["timeout"]["type"] == "integer"
    assert "python" in local["supported_languages"]
    assert data["self_managed"]["config_schema"]["api_key"]["secret"] is True
    for p in data.values():
        assert {"id", "name", "description", "tags", "config_schema", "usable", "reason"} <= set(p)


def test_config_crud_reaches_the_running_provider(admin):
    cfg = admin.get(API + "/config").json()
    assert cfg["active"] == "local" and cfg["local"]["timeout"] == 30
    assert cfg["self_managed"]["endpoint"] == "http://localhost:9385"  # schema default, never stored
    assert admin.providers.current().config["timeout"] == 30

    r = admin.post(API + "/config", json={"provider_type": "local", "config": {"timeout": 12, "pool_size": 0}})
    assert r.status_code == 200, r.text
    assert r.json()["config"]["timeout"] == 12
    assert admin.get(API + "/config").json()["local"]["timeout"] == 12
    assert admin.providers.current().config["timeout"] == 12  # hot reload, no restart
    assert stored_row(admin.store, "sandbox.local") == {"timeout": 12, "pool_size": 0}


def test_validation_errors_are_400_per_field_and_store_nothing(admin):
    before = stored_row(admin.store, "sandbox.local")
    r = admin.post(API + "/config", json={"provider_type": "local", "config": {
        "timeout": "soon", "max_timeout": 0, "pool_size": 999, "bogus": 1}})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "SB002"
    fields = err["details"]["fields"]
    assert fields["timeout"] == "must be an integer"
    assert fields["max_timeout"].startswith("must be >=")
    assert fields["pool_size"].startswith("must be <=")
    assert fields["bogus"].startswith("unknown field")
    # validate_config (beyond the schema) is attributed to its field too.
    r = admin.post(API + "/config", json={"provider_type": "local", "config": {"python": "/nonexistent/python"}})
    assert r.status_code == 400 and "python" in r.json()["error"]["details"]["fields"]
    r = admin.post(API + "/config", json={"provider_type": "self_managed", "config": {"endpoint": "ftp://x"}})
    assert r.status_code == 400 and "endpoint" in r.json()["error"]["details"]["fields"]
    r = admin.post(API + "/config", json={"provider_type": "nope", "config": {}})
    assert r.status_code == 400 and r.json()["error"]["details"]["fields"] == {"provider_type": "unknown provider"}
    r = admin.post(API + "/config", json={"config": {}})
    assert r.status_code == 400 and r.json()["error"]["code"] == "SB002"
    assert stored_row(admin.store, "sandbox.local") == before


def test_secrets_encrypted_at_rest_redacted_and_kept_through_a_redacted_round_trip(admin):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    r = admin.post(API + "/config", json={"provider_type": "self_managed", "set_active": False,
                                          "config": {"endpoint": endpoint, "api_key": SECRET}})
    assert r.status_code == 200, r.text
    assert SECRET not in r.text
    row = stored_row(admin.store, "sandbox.self_managed")
    assert is_encrypted(row["api_key"]) and SECRET not in json.dumps(row)  # ciphertext really stored

    cfg = admin.get(API + "/config")
    assert SECRET not in cfg.text
    redacted = cfg.json()["self_managed"]["api_key"]
    assert redacted == "****" + SECRET[-4:]

    # The console sends the redacted value back unchanged with another edit: the secret survives.
    r = admin.post(API + "/config", json={"provider_type": "self_managed", "set_active": False,
                                          "config": {"endpoint": endpoint, "api_key": redacted, "timeout": 7}})
    assert r.status_code == 200, r.text
    assert admin.providers.settings.decrypted("self_managed")["api_key"] == SECRET
    assert admin.providers.settings.effective("self_managed")["timeout"] == 7
    assert stored_row(admin.store, "sandbox.self_managed")["api_key"] != row["api_key"]  # fresh nonce

    # A placeholder that matches nothing is refused rather than stored as the secret.
    r = admin.post(API + "/config", json={"provider_type": "self_managed", "set_active": False,
                                          "config": {"endpoint": endpoint, "api_key": "****nope"}})
    assert r.status_code == 400 and "api_key" in r.json()["error"]["details"]["fields"]
    assert admin.providers.settings.decrypted("self_managed")["api_key"] == SECRET

    # Replaying a ciphertext read from the database is refused, not stored as if encrypted.
    r = admin.post(API + "/config", json={"provider_type": "self_managed", "set_active": False,
                                          "config": {"endpoint": endpoint, "api_key": row["api_key"]}})
    assert r.status_code == 400 and "ciphertext" in r.json()["error"]["details"]["fields"]["api_key"]
    assert admin.providers.settings.decrypted("self_managed")["api_key"] == SECRET


class _Listener:
    """An admin's own HTTP listener, recording what reaches it (the exfiltration target)."""

    def __init__(self) -> None:
        import http.server
        import threading

        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                seen.append((self.command, self.path, self.headers.get("Authorization")))
                body = b'{"status":"success","stdout":"execbox-probe 42\\n","stderr":"","exit_code":0}'
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _any

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_changed_endpoint_never_receives_the_stored_secret(admin):
    r = admin.post(API + "/config", json={"provider_type": "self_managed", "set_active": False,
                                          "config": {"endpoint": f"http://127.0.0.1:{closed_port()}",
                                                     "api_key": SECRET}})
    assert r.status_code == 200, r.text
    redacted = admin.get(API + "/config").json()["self_managed"]["api_key"]
    listener = _Listener()
    try:
        for route in ("/test", "/config"):
            for config in ({"endpoint": listener.url, "api_key": redacted}, {"endpoint": listener.url}):
                body = {"provider_type": "self_managed", "config": config}
                r = admin.post(API + route, json=body if route == "/test" else {**body, "set_active": False})
                assert r.status_code == 400, r.text
                err = r.json()["error"]
                assert err["code"] == "SB002" and SECRET not in r.text
                assert err["details"]["fields"]["api_key"] == "re-enter api_key when endpoint changes"
        assert listener.seen == []
        assert admin.providers.settings.decrypted("self_managed")["api_key"] == SECRET  # nothing stored
        # The secret typed again with the new endpoint is the admin's own to send: allowed.
        r = admin.post(API + "/test", json={"provider_type": "self_managed",
                                            "config": {"endpoint": listener.url, "api_key": "sk-typed-again-0000"}})
        assert r.status_code == 200, r.text
        assert listener.seen and all(auth == "Bearer sk-typed-again-0000" for _, _, auth in listener.seen)
    finally:
        listener.close()


def test_probe_really_runs_code(admin):
    r = admin.post(API + "/test", json={"provider_type": "local", "config": {"timeout": 10}})
    assert r.status_code == 200
    body = r.json()
    assert body["success"] is True and body["latency_ms"] > 0
    assert body["details"]["exit_code"] == 0 and "execbox-probe 42" in body["details"]["stdout"]
    assert "probe-stderr" in body["details"]["stderr"]

    dead = {"endpoint": f"http://127.0.0.1:{closed_port()}", "max_retries": 0, "api_key": SECRET}
    body = admin.post(API + "/test", json={"provider_type": "self_managed", "config": dead}).json()
    assert body["success"] is False and "SB003" in body["message"]
    assert SECRET not in json.dumps(body)


def test_failed_connection_test_leaves_stored_config_untouched(admin):
    before = stored_row(admin.store, "sandbox.self_managed")
    dead = {"endpoint": f"http://127.0.0.1:{closed_port()}", "max_retries": 0}
    r = admin.post(API + "/config", json={"provider_type": "self_managed", "config": dead,
                                          "test_connection": True})
    assert r.status_code == 502 and r.json()["error"]["code"] == "SB003"
    assert r.json()["error"]["details"]["test"]["success"] is False
    assert stored_row(admin.store, "sandbox.self_managed") == before
    assert admin.get(API + "/config").json()["active"] == "local"
    r = admin.post(API + "/config", json={"provider_type": "local", "config": {"timeout": 9},
                                          "test_connection": True})
    assert r.status_code == 200 and r.json()["test"]["success"] is True


def test_switching_active_provider(admin):
    r = admin.put(API + "/active", json={"provider": "nope"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "SB002"
    r = admin.put(API + "/active", json={"provider": "self_managed"})  # not in this seed
    assert r.status_code == 409 and r.json()["error"]["code"] == "SB002"
    endpoint = f"http://127.0.0.1:{closed_port()}"
    assert admin.post(API + "/config", json={"provider_type": "self_managed", "set_active": False,
                                             "config": {"endpoint": endpoint}}).status_code == 200
    assert admin.providers.current().name == "local"
    r = admin.put(API + "/active", json={"provider": "self_managed"})
    assert r.status_code == 200 and r.json()["active"] == "self_managed"
    assert admin.providers.current().name == "self_managed"
    assert admin.get(API + "/config").json()["active"] == "self_managed"


def test_fallback_list_roundtrip_and_validation(admin):
    assert admin.get(API + "/fallback").json() == {"providers": []}
    r = admin.put(API + "/fallback", json={"providers": ["self_managed", "local"]})
    assert r.status_code == 200 and r.json()["providers"] == ["self_managed", "local"]
    assert admin.get(API + "/fallback").json()["providers"] == ["self_managed", "local"]
    r = admin.put(API + "/fallback", json={"providers": ["local", "nope", "local"]})
    assert r.status_code == 400
    assert set(r.json()["error"]["details"]["fields"]) == {"providers[1]", "providers[2]"}
    r = admin.put(API + "/fallback", json={"providers": "local"})
    assert r.status_code == 400
    assert admin.get(API + "/fallback").json()["providers"] == ["self_managed", "local"]


def test_status_and_audit(admin):
    st = admin.get(API + "/status").json()
    assert st["serving"]["provider"] == "local" and st["serving"]["healthy"] is True
    assert st["store"]["ok"] is True and st["configured_active"] == "local"
    r = admin.post("/v1/sandbox/execute", json={"code": "print(1)"}, headers=admin.tenant_headers)
    assert r.status_code == 200
    deadline = time.monotonic() + 10
    entries = []
    while not entries and time.monotonic() < deadline:  # the audit writer is async
        entries = admin.get(API + "/audit", params={"tenant_id": "acme"}).json()["data"]
        time.sleep(0.05)
    assert entries and entries[0]["provider"] == "local" and entries[0]["tenant_id"] == "acme"
    assert admin.get(API + "/audit", params={"limit": 0}).status_code == 400
    assert admin.get(API + "/audit", headers=admin.tenant_headers).status_code == 403
