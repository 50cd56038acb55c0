"""Store on SQLite: migrations from empty, settings versions, tokens, audit."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from execbox.errors import InvalidConfigError
from execbox.service.store import open_store


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path)
    yield s
    s.close()


def test_migrations_from_empty_create_tables_at_head(tmp_path):
    s = open_store(tmp_path)
    assert s.revision() == "0006"
    assert s.ping()
    tables = {r[0] for r in sqlite3.connect(tmp_path / "execbox.db").execute(
        "select name from sqlite_master where type='table'")}
    assert {"system_settings", "tokens", "audit", "alembic_version"} <= tables
    s.close()
    # Re-opening an up-to-date database is a no-op and keeps data.
    s2 = open_store(tmp_path)
    assert s2.revision() == "0006"
    s2.close()


def test_data_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("EXECBOX_DATA_DIR", str(tmp_path / "dd"))
    s = open_store()
    assert (tmp_path / "dd" / "execbox.db").exists()
    s.close()


def test_settings_roundtrip_and_version_strictly_increases(store):
    assert store.settings.get("sandbox.local") is None
    assert store.settings.all() == {}
    v0 = store.settings.version()
    store.settings.set("sandbox.local", '{"timeout": 5}')
    v1 = store.settings.version()
    store.settings.set("sandbox.local", '{"timeout": 6}')
    v2 = store.settings.version()
    assert v0 < v1 < v2
    assert store.settings.get("sandbox.local") == '{"timeout": 6}'
    rec = store.settings.get_record("sandbox.local")
    assert rec.source == "admin" and rec.data_type == "json" and rec.update_time == v2
    assert list(store.settings.all()) == ["sandbox.local"]


def test_registry_id_is_made_once_stays_internal_and_does_not_bump_the_version(tmp_path):
    s = open_store(tmp_path)
    v0 = s.settings.version()
    ident = s.sessions.identity()
    assert ident.startswith("reg-") and s.sessions.identity() == ident
    assert s.settings.all() == {} and s.settings.version() == v0  # no hot reload, not a setting
    s.settings.set("xstore.y", "1")  # '_' in the internal prefix is not a LIKE wildcard
    assert list(s.settings.all()) == ["xstore.y"]
    s.close()
    s2 = open_store(tmp_path)
    assert s2.sessions.identity() == ident  # stable: it names the workspaces directory
    s2.close()
    other = open_store(tmp_path / "other")
    assert other.sessions.identity() != ident
    other.close()


def test_set_many_is_all_or_nothing(store):
    with pytest.raises(InvalidConfigError):
        store.settings.set_many({"a": "1", "b": 2})  # type: ignore[dict-item]
    assert store.settings.get("a") is None


def test_concurrent_read_modify_write_loses_no_update(store):
    store.settings.set("counter", "0")

    def bump() -> None:
        for _ in range(10):
            store.settings.update("counter", lambda v: str(int(v or 0) + 1))

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.settings.get("counter") == "40"


def test_tokens_are_hashed_verified_and_revocable(store, tmp_path):
    rec, plaintext = store.tokens.create("acme", "admin", "ops")
    assert plaintext.startswith("ebx_") and len(plaintext) > 40
    assert store.tokens.verify(plaintext) == rec
    assert store.tokens.verify(plaintext + "x") is None
    assert store.tokens.verify("") is None
    db = sqlite3.connect(tmp_path / "execbox.db")
    rows = db.execute("select token_hash, prefix, last4 from tokens").fetchall()
    assert plaintext not in repr(rows)
    assert rows[0][2] == plaintext[-4:]
    assert rec.display.endswith(plaintext[-4:]) and plaintext not in rec.display
    assert store.tokens.count() == 1
    assert store.tokens.revoke(rec.id) is True
    assert store.tokens.revoke(rec.id) is False
    assert store.tokens.verify(plaintext) is None
    assert store.tokens.count() == 0
    assert [r.id for r in store.tokens.list(include_revoked=True)] == [rec.id]


def test_token_rejects_bad_role(store):
    with pytest.raises(InvalidConfigError):
        store.tokens.create("acme", "root")


def test_audit_records_and_filters(store):
    store.audit.record(tenant_id="a", provider="local", operation="execute", code="print(1)", status="ok",
                       exit_code=0, duration_ms=3.5)
    store.audit.record(tenant_id="b", provider="local", operation="execute", status="error",
                       error_code="SB005")
    assert [e["tenant_id"] for e in store.audit.list()] == ["b", "a"]
    (a,) = store.audit.list(tenant_id="a")
    assert a["code_hash"].startswith("sha256:") and len(a["code_hash"]) == 71 and a["exit_code"] == 0
    with pytest.raises(InvalidConfigError):
        store.audit.record(tenant_id="a", bogus=1)
