"""GET /api/admin/sandbox/audit stays small and reaches every row: lists leave the code out
(``has_code`` instead; GET /audit/{id} returns it), ``before_id`` pages back through all rows,
``since``/``until`` bound the time. On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from execbox.service.app import create_app
from execbox.service.config import ServiceSettings
from execbox.service.provider_manager import ProviderManager
from execbox.service.store import open_store

from .helpers import keyring, write_seed

API = "/api/admin/sandbox/audit"
BIG = "#" * (1024 * 1024)


@pytest.fixture
def admin(db_url, tmp_path):  # noqa: ANN001, ANN201
    store = open_store(tmp_path, url=db_url)
    providers = ProviderManager(store, keyring=keyring(), env={"SANDBOX_TYPE": "local"},
                                seed_file=write_seed(tmp_path))
    app = create_app(store=store, providers=providers, settings=ServiceSettings(audit_code=True))
    _, admin_token = store.tokens.create("ops", "admin")
    _, tenant_token = store.tokens.create("acme")
    for i in range(5):  # 1 MiB of code each
        store.audit.record(tenant_id="acme", operation="execute_code", code=BIG + str(i), created_at=1000.0 + i)
    store.audit.record(tenant_id="other", operation="run_command", created_at=2000.0)  # no code kept
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {admin_token}"
        client.tenant_headers = {"Authorization": f"Bearer {tenant_token}"}
        yield client
    providers.shutdown()
    store.close()


def test_list_leaves_the_code_out(admin) -> None:  # noqa: ANN001
    r = admin.get(API, params={"limit": 1000})
    assert r.status_code == 200 and len(r.content) < 64 * 1024, len(r.content)
    rows = r.json()["data"]
    assert len(rows) == 6 and all("code" not in row for row in rows)
    assert [row["has_code"] for row in rows] == [False, True, True, True, True, True]
    assert rows[1]["code_hash"].startswith("sha256:") and r.json()["next_before_id"] is None


def test_one_entry_carries_its_code(admin) -> None:  # noqa: ANN001
    newest_acme = admin.get(API, params={"tenant_id": "acme", "limit": 1}).json()["data"][0]
    r = admin.get(f"{API}/{newest_acme['id']}")
    assert r.status_code == 200 and r.json()["data"]["code"] == BIG + "4"
    assert r.json()["data"]["tenant_id"] == "acme" and r.json()["data"]["id"] == newest_acme["id"]
    r = admin.get(f"{API}/999999")
    assert r.status_code == 404 and r.json()["error"]["code"] == "SB002"
    assert admin.get(f"{API}/{newest_acme['id']}", headers=admin.tenant_headers).status_code == 403


def test_before_id_pages_through_every_row(admin) -> None:  # noqa: ANN001
    seen, cursor, pages = [], None, 0
    while True:
        params = {"tenant_id": "acme", "limit": 2, **({"before_id": cursor} if cursor else {})}
        body = admin.get(API, params=params).json()
        seen += [row["created_at"] for row in body["data"]]
        pages += 1
        cursor = body["next_before_id"]
        if cursor is None:
            break
    assert seen == [1004.0, 1003.0, 1002.0, 1001.0, 1000.0] and pages == 3


def test_since_and_until_bound_the_time(admin) -> None:  # noqa: ANN001
    rows = admin.get(API, params={"since": 1001, "until": 1003}).json()["data"]
    assert [row["created_at"] for row in rows] == [1002.0, 1001.0]
    assert [row["tenant_id"] for row in admin.get(API, params={"since": 1500}).json()["data"]] == ["other"]


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 1001}, {"before_id": 0}, {"since": "nan"},
                                    {"since": 5, "until": 4}, {"before_id": "x"}])
def test_bad_parameters_are_400(admin, params) -> None:  # noqa: ANN001
    r = admin.get(API, params=params)
    assert r.status_code == 400 and r.json()["error"]["code"] == "SB002"


def test_old_rows_are_pruned_in_batches_on_both_databases(db_url, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """store/retention.py's batched delete (a subquery with ORDER BY and LIMIT) on SQLite and PostgreSQL."""
    import time

    from execbox.service.store import retention

    monkeypatch.setattr(retention, "PRUNE_BATCH", 4)
    store = open_store(tmp_path, url=db_url)
    try:
        now = time.time()
        for i in range(10):
            store.audit.record(tenant_id="t", operation="execute", session_id=f"old-{i}", created_at=now - 400 * 86400)
        store.audit.record(tenant_id="t", operation="execute", session_id="recent", created_at=now)
        assert store.audit.prune(now - 365 * 86400) == 10
        assert [r["session_id"] for r in store.audit.list(limit=100)] == ["recent"]
    finally:
        store.close()
