"""The store on both databases: migrations from empty, versions, tokens, concurrent writers."""

from __future__ import annotations

import threading

from sqlalchemy import inspect

from execbox.service.store import open_store


def test_migrations_from_empty_and_idempotent(db_url, tmp_path):
    store = open_store(tmp_path, url=db_url)
    try:
        assert store.revision() == "0001"
        tables = set(inspect(store.engine).get_table_names())
        assert {"system_settings", "tokens", "audit", "alembic_version"} <= tables
        store.settings.set("sandbox.local", '{"timeout": 3}')
    finally:
        store.close()
    again = open_store(tmp_path, url=db_url)
    try:
        assert again.settings.get("sandbox.local") == '{"timeout": 3}'
    finally:
        again.close()


def test_tokens_and_audit(db_url, tmp_path):
    with open_store(tmp_path, url=db_url) as store:
        rec, tok = store.tokens.create("acme", "admin")
        assert store.tokens.verify(tok).id == rec.id
        store.tokens.revoke(rec.id)
        assert store.tokens.verify(tok) is None
        store.audit.record(tenant_id="acme", provider="local", operation="execute", status="ok")
        assert store.audit.list(tenant_id="acme")[0]["status"] == "ok"


def test_concurrent_writers_serialise_and_versions_strictly_increase(db_url, tmp_path):
    with open_store(tmp_path, url=db_url) as store:
        store.settings.set("counter", "0")
        seen: list[float] = []

        def bump() -> None:
            for _ in range(10):
                store.settings.update("counter", lambda v: str(int(v or 0) + 1))
                seen.append(store.settings.version())

        threads = [threading.Thread(target=bump) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert store.settings.get("counter") == "50"
        stamps = sorted(r.update_time for r in store.settings.all().values())
        assert stamps == sorted(set(stamps))


def test_database_outage_keeps_serving_the_loaded_provider(pg_server, tmp_path):
    import psycopg

    from execbox.service.crypto import KeyRing, generate_key
    from execbox.service.provider_config import ProviderConfig

    from .conftest import new_pg_database

    url = new_pg_database(pg_server)
    store = open_store(tmp_path, url=url)
    pc = ProviderConfig(store, keyring=KeyRing(generate_key()), env={"SANDBOX_TYPE": "local"})
    try:
        provider = pc.current()
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(pg_server.replace("postgresql+psycopg", "postgresql") + "/postgres",
                             autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')  # the database is gone for real
        assert pc.current() is provider  # still serving, no exception
        inst = provider.create_instance("python")
        assert provider.execute_code(inst.instance_id, "print(2)", "python").stdout == "2\n"
        provider.destroy_instance(inst.instance_id)
        assert store.ping() is False
    finally:
        pc.shutdown()
        store.close()
