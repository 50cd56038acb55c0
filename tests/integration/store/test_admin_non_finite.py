"""The admin API refuses NaN and infinities for number fields with 400 naming the field, and
stores nothing (review 50, F2: NaN passed every min/max comparison and was stored as invalid
JSON, after which every run failed)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from execbox.service.app import create_app
from execbox.service.config import ServiceSettings
from execbox.service.provider_manager import ProviderManager
from execbox.service.store import open_store

from .helpers import keyring, write_seed


@pytest.fixture
def admin(db_url, tmp_path):
    store = open_store(tmp_path, url=db_url)
    providers = ProviderManager(store, keyring=keyring(), env={"SANDBOX_TYPE": "local"},
                                seed_file=write_seed(tmp_path))
    app = create_app(store=store, providers=providers, settings=ServiceSettings())
    _, token = store.tokens.create("ops", "admin")
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        client.store = store
        yield client
    providers.shutdown()
    store.close()


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_number_is_refused_naming_the_field(admin, literal) -> None:
    before = admin.store.settings.get("sandbox.jail")
    body = '{"provider_type": "jail", "config": {"cpus": ' + literal + '}, "set_active": true}'
    r = admin.post("/api/admin/sandbox/config", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "SB002" and error["details"]["fields"]["cpus"] == "must be a finite number", error
    assert admin.store.settings.get("sandbox.jail") == before
    assert admin.store.settings.get("sandbox.provider_type") != "jail"
