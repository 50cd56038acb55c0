"""A database written by a newer execbox (a revision this one does not know), an unknown target
revision and a downgrade: one SB002 naming the revisions, never Alembic's traceback nor a
silent "success" (review 50, F1), on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from execbox.cli import app
from execbox.errors import InvalidConfigError
from execbox.service.store import open_store, upgrade
from execbox.service.store.engine import head_revision


def _stamp(store, revision: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})


@pytest.fixture
def cli(db_url, tmp_path, monkeypatch):
    monkeypatch.setenv("EXECBOX_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("EXECBOX_DATABASE_URL", db_url)
    monkeypatch.delenv("EXECBOX_SECRET_KEY", raising=False)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


def test_a_database_from_a_newer_execbox_is_one_clear_sb002(db_url, tmp_path, cli) -> None:
    head = head_revision()
    with open_store(tmp_path, url=db_url) as store:
        _stamp(store, "0099")
    with pytest.raises(InvalidConfigError) as e:
        open_store(tmp_path, url=db_url)
    message = e.value.message
    assert "0099" in message and f"head {head}" in message and "newer execbox" in message
    assert e.value.details["revision"] == "0099" and e.value.details["head"] == head

    status = cli("db", "status")
    assert status.exit_code == 2, status.output
    assert "newer than this execbox" in status.output and "run `execbox db upgrade`" not in status.output
    for args in (("db", "upgrade"), ("token", "list"), ("config", "show"), ("secrets", "status")):
        r = cli(*args)
        assert r.exit_code == 2 and "SB002" in r.output and "0099" in r.output, (args, r.output)
        assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.exception)


def test_a_downgrade_and_an_unknown_target_are_refused(db_url, tmp_path, cli) -> None:
    head = head_revision()
    store = open_store(tmp_path, url=db_url)
    try:
        with pytest.raises(InvalidConfigError, match="downgrades are not supported"):
            upgrade(store.engine, "0003")
        assert store.revision() == head
        with pytest.raises(InvalidConfigError, match="unknown schema revision 'nonsense'"):
            upgrade(store.engine, "nonsense")
        upgrade(store.engine, head)  # the database's own revision: nothing to do, not refused
        assert store.revision() == head
    finally:
        store.close()
    r = cli("db", "upgrade", "0003")
    assert r.exit_code == 2 and "downgrades are not supported" in r.output, r.output
    r = cli("db", "upgrade", "nonsense")
    assert r.exit_code == 2 and "SB002" in r.output and "Traceback" not in r.output, r.output


def test_an_upgrade_to_a_named_revision_still_works(db_url, tmp_path) -> None:
    store = open_store(tmp_path, url=db_url, migrate=False)
    try:
        upgrade(store.engine, "0002")
        assert store.revision() == "0002"
        upgrade(store.engine)
        assert store.revision() == head_revision()
    finally:
        store.close()
