"""`execbox token|config|db|secrets` against a SQLite store in a temp data dir."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from execbox.cli import app
from execbox.service.store import open_store


@pytest.fixture
def cli(tmp_path, monkeypatch):
    for var in ("SANDBOX_TYPE", "SANDBOX_BACKEND", "EXECBOX_DATABASE_URL", "EXECBOX_SECRET_KEY",
                "SANDBOX_TIMEOUT_SEC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("EXECBOX_DATA_DIR", str(tmp_path))
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None):
        return runner.invoke(app, list(args), input=input)

    invoke.data_dir = tmp_path
    return invoke


def test_token_create_prints_once_and_list_never_shows_it(cli):
    r = cli("token", "create", "--tenant", "acme", "--admin", "--json")
    assert r.exit_code == 0, r.output
    created = json.loads(r.stdout)
    plaintext = created["token"]
    with open_store(cli.data_dir) as store:
        assert store.tokens.verify(plaintext).role == "admin"
    listed = cli("token", "list", "--json")
    assert plaintext not in listed.stdout and json.loads(listed.stdout)[0]["token"].endswith(plaintext[-4:])
    assert cli("token", "revoke", created["id"]).exit_code == 0
    assert cli("token", "revoke", created["id"]).exit_code == 2
    with open_store(cli.data_dir) as store:
        assert store.tokens.verify(plaintext) is None


def test_config_set_validates_like_the_api(cli):
    r = cli("config", "set", "local", "timeout=soon", "pool_size=99", "nope=1")
    assert r.exit_code == 2
    assert "timeout: must be an integer" in r.output and "pool_size: must be <= 32" in r.output
    assert "nope: unknown field" in r.output
    assert cli("config", "set", "local", "not-a-pair").exit_code == 2
    r = cli("config", "set", "local", "timeout=12", "--activate")
    assert r.exit_code == 0, r.output
    shown = json.loads(cli("config", "show", "local", "--json").stdout)
    assert shown["active"] == "local" and shown["local"]["timeout"] == 12
    # key= removes the stored value: the schema default applies again.
    assert cli("config", "set", "local", "timeout=").exit_code == 0
    assert json.loads(cli("config", "show", "local", "--json").stdout)["local"]["timeout"] == 30


def test_config_secret_prompt_is_encrypted_and_redacted(cli):
    secret = "prompted-secret-0123456789"
    r = cli("config", "set", "self_managed", "endpoint=http://127.0.0.1:9", "api_key=?", input=secret + "\n")
    assert r.exit_code == 0, r.output
    assert secret not in r.output and "api_key=****6789" in r.output
    with open_store(cli.data_dir) as store:
        assert secret not in store.settings.get("sandbox.self_managed")
    assert json.loads(cli("config", "show", "self_managed", "--json").stdout)["self_managed"]["api_key"] == \
        "****" + secret[-4:]


def test_activate_and_fallback_errors(cli):
    r = cli("config", "activate", "nope")
    assert r.exit_code == 2 and "provider: unknown provider" in r.output
    assert cli("config", "fallback", "local").exit_code == 0
    assert json.loads(cli("config", "show", "local", "--json").stdout)["fallback"] == ["local"]
    assert cli("config", "fallback", "nope").exit_code == 2
    r = cli("config", "fallback", "none")  # as --help and docs/admin.md say: clears the list
    assert r.exit_code == 0 and "fallback: (none)" in r.stdout, r.output
    assert json.loads(cli("config", "show", "local", "--json").stdout)["fallback"] == []


def test_db_upgrade_and_status(cli):
    r = cli("db", "status")
    assert r.exit_code == 0 and "empty" in r.stdout
    r = cli("db", "upgrade")
    assert r.exit_code == 0 and "-> 0006" in r.stdout
    assert "(head 0006)" in cli("db", "status").stdout


def test_secrets_rotate_with_env_key_and_previous(cli, monkeypatch):
    from execbox.service.crypto import encode_key, generate_key

    old, new = encode_key(generate_key()), encode_key(generate_key())
    monkeypatch.setenv("EXECBOX_SECRET_KEY", old)
    assert cli("config", "set", "self_managed", "endpoint=http://127.0.0.1:9",
               "api_key=env-secret-0123456789").exit_code == 0
    monkeypatch.setenv("EXECBOX_SECRET_KEY", new)
    r = cli("config", "show", "self_managed")
    assert "cannot decrypt" in r.output  # wrong key: clear, per provider
    monkeypatch.setenv("EXECBOX_SECRET_KEY_PREVIOUS", old)
    r = cli("secrets", "rotate")
    assert r.exit_code == 0 and "re-encrypted 1 secret" in r.stdout
    monkeypatch.delenv("EXECBOX_SECRET_KEY_PREVIOUS")
    assert "****6789" in cli("config", "show", "self_managed").stdout


def test_config_set_refuses_timeout_above_max_timeout(cli):
    """Review 50, F3: every run naming no timeout would fail SB002; nothing is stored."""
    r = cli("config", "set", "local", "timeout=600", "max_timeout=60", "--activate")
    assert r.exit_code == 2 and "timeout: must be <= max_timeout (60)" in r.output
    assert cli("config", "set", "local", "max_timeout=10").exit_code == 2  # below the default timeout, 30
    shown = json.loads(cli("config", "show", "local", "--json").stdout)
    assert shown["active"] != "local" and (shown["local"]["timeout"], shown["local"]["max_timeout"]) == (30, 3600)
