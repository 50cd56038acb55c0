"""Review 50, on SQLite and PostgreSQL. F3: a provider ``timeout`` above its ``max_timeout`` is
refused (every run naming no timeout would fail SB002), nothing stored, and a row stored before
the rule is not activated. The admin token API and ``TokensRepo.create`` take tenant ids by the
service's one rule (sessions/workspace.py), so no token is minted for a tenant every sandbox
request would refuse, nor refused for one it takes."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from execbox.errors import InvalidConfigError
from execbox.service.app import create_app
from execbox.service.config import ServiceSettings
from execbox.service.provider_manager import ProviderManager
from execbox.service.sessions.workspace import check_name
from execbox.service.store import open_store

from .helpers import keyring, write_seed


@pytest.fixture
def admin(db_url, tmp_path):  # noqa: ANN001, ANN201
    store = open_store(tmp_path, url=db_url)
    providers = ProviderManager(store, keyring=keyring(), env={"SANDBOX_TYPE": "local"},
                                seed_file=write_seed(tmp_path))
    app = create_app(store=store, providers=providers, settings=ServiceSettings())
    _, admin_token = store.tokens.create("ops", "admin")
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {admin_token}"
        client.store = store
        client.providers = providers
        yield client
    providers.shutdown()
    store.close()


@pytest.mark.parametrize(("config", "limit"), [({"timeout": 600, "max_timeout": 60}, 60),
                                               ({"max_timeout": 10}, 10)])  # the default timeout is 30
def test_timeout_above_max_timeout_is_refused_and_nothing_stored(admin, config, limit) -> None:  # noqa: ANN001
    before = admin.store.settings.version()
    r = admin.post("/api/admin/sandbox/config", json={"provider_type": "local", "config": config, "set_active": True})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "SB002" and error["details"]["fields"] == {"timeout": f"must be <= max_timeout ({limit})"}
    assert admin.store.settings.version() == before and admin.providers.settings.stored("local") == {"timeout": 30}
    ok = admin.post("/api/admin/sandbox/config",
                    json={"provider_type": "local", "config": {"timeout": limit, "max_timeout": limit}})
    assert ok.status_code == 200, ok.text


def test_a_stored_row_with_timeout_above_max_timeout_is_not_activated(admin) -> None:  # noqa: ANN001
    admin.store.settings.set("sandbox.jail", json.dumps({"timeout": 600, "max_timeout": 60}), data_type="json")
    r = admin.put("/api/admin/sandbox/active", json={"provider": "jail"})
    assert r.status_code == 409, r.text
    assert r.json()["error"]["details"]["config_errors"] == {"timeout": "must be <= max_timeout (60)"}
    assert admin.providers.settings.active() == "local"


def _service_takes(tenant: str) -> bool:
    try:
        check_name(tenant, "tenant_id")
    except InvalidConfigError:
        return False
    return True


TENANTS = ["acme", "_svc", "a" * 64, "a" * 65, "a" * 128, ".x", "-x", "a/b", "ac me"]


@pytest.mark.parametrize("tenant", TENANTS)
def test_token_api_takes_exactly_the_tenants_the_service_takes(admin, tenant) -> None:  # noqa: ANN001
    r = admin.post("/api/admin/tokens", json={"tenant_id": tenant})
    assert (r.status_code == 201) == _service_takes(tenant), r.text
    if r.status_code != 201:
        assert r.status_code == 400 and r.json()["error"]["code"] == "SB002", r.text


@pytest.mark.parametrize("tenant", TENANTS)
def test_tokens_repo_takes_exactly_the_tenants_the_service_takes(admin, tenant) -> None:  # noqa: ANN001
    if _service_takes(tenant):
        rec, _ = admin.store.tokens.create(tenant)
        assert rec.tenant_id == tenant
        return
    count = admin.store.tokens.count()
    with pytest.raises(InvalidConfigError) as e:
        admin.store.tokens.create(tenant)
    assert e.value.details == {"fields": {"tenant_id": "invalid"}} and "1-64 characters" in e.value.message
    assert admin.store.tokens.count() == count
