"""The store on both databases: migrations from empty, versions, tokens, concurrent writers."""

from __future__ import annotations

import threading

from sqlalchemy import inspect

from execbox.service.store import open_store


def test_migrations_from_empty_and_idempotent(db_url, tmp_path):
    store = open_store(tmp_path, url=db_url)
    try:
        assert store.revision() == "0006"
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
        store.audit.record(tenant_id="acme", provider="local", operation="execute", status="ok",
                           code_hash="sha256:" + "a" * 64, session_id="s1", token_id=rec.id,
                           instance_id="i" * 300)
        (entry,) = store.audit.list(tenant_id="acme")
        assert entry["status"] == "ok" and entry["code_hash"] == "sha256:" + "a" * 64
        assert entry["session_id"] == "s1" and entry["token_id"] == rec.id
        assert len(entry["instance_id"]) == 256 and entry["instance_id"].endswith("…")  # clipped, not lost


def test_upgrade_from_0001_keeps_data(db_url, tmp_path):
    from execbox.service.store import upgrade

    store = open_store(tmp_path, url=db_url, migrate=False)
    try:
        upgrade(store.engine, "0001")
        assert store.revision() == "0001"
        with store.engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO audit (tenant_id, operation, code_hash, created_at) "
                                 "VALUES ('old', 'execute', 'abc', 1.0)")
        upgrade(store.engine)
        assert store.revision() == "0006"
        assert store.audit.list(tenant_id="old")[0]["code_hash"] == "abc"
    finally:
        store.close()


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
    from execbox.service.provider_manager import ProviderManager

    from .conftest import new_pg_database

    url = new_pg_database(pg_server)
    store = open_store(tmp_path, url=url)
    pc = ProviderManager(store, keyring=KeyRing(generate_key()), env={"SANDBOX_TYPE": "local"})
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


def test_processes_starting_together_on_an_empty_database_migrate_once(db_url, tmp_path):
    import subprocess
    import sys

    script = ("import sys; from execbox.service.store import open_store; "
              "s = open_store(sys.argv[1], url=sys.argv[2]); print(s.revision()); s.close()")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / f"d{i}"), db_url],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [o[1][-800:] for o in outs]
    assert [o[0].strip() for o in outs] == ["0006"] * 4
