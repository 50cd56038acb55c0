"""A running `execbox serve` follows `execbox secrets rotate` at once: after a rotation (run from
the CLI, another process), new provider secrets, E2B env vars and E2B access tokens are made under
the new key, never the retired one; what was made under the replaced key still decrypts and
its tokens still open while that key is kept in secret.key.previous."""

from __future__ import annotations

import os
import time

import pytest

from execbox.cli import secrets as secrets_cli
from execbox.service import crypto
from execbox.service.e2b_compat import persist
from execbox.service.e2b_compat.persist import SandboxStore
from execbox.service.e2b_compat.registry import E2BSandbox, new_sandbox_id
from execbox.service.store import open_store
from execbox.service.store import sandbox_settings as sandbox_settings_module
from execbox.service.store.sandbox_settings import SandboxSettings

ENDPOINT = "http://127.0.0.1:9"


@pytest.fixture
def store(tmp_path, monkeypatch):
    for var in ("EXECBOX_SECRET_KEY", "EXECBOX_SECRET_KEY_PREVIOUS", "EXECBOX_NEW_SECRET_KEY"):
        monkeypatch.delenv(var, raising=False)
    with open_store(tmp_path) as s:
        yield s


def _save(settings: SandboxSettings, secret: str) -> str:
    """Save a provider secret through ``settings``; the key id it was stored under."""
    settings.save("self_managed", settings.validate("self_managed", {"endpoint": ENDPOINT, "api_key": secret}))
    return crypto.ciphertext_key_id(settings.stored("self_managed")["api_key"])


def _create(rows: SandboxStore, value: str) -> E2BSandbox:
    sb = E2BSandbox(new_sandbox_id(), "t1", "base", {}, {"API_TOKEN": value}, time.time() + 3600)
    rows.insert(sb)
    return sb


def _env_key_id(store, sb: E2BSandbox) -> str:
    return crypto.ciphertext_key_id(store.e2b.get(sb.sandbox_id)["env_vars"])


def _key_file_id(store) -> str:
    return crypto.key_id(crypto.read_key_file(store.data_dir / crypto.KEY_FILE))


def _restarted(store) -> SandboxStore:
    """A process started now (its own settings, keys loaded from the files)."""
    settings = SandboxSettings(store)
    return SandboxStore(store.e2b, lambda: settings.keyring)


def test_a_running_service_encrypts_and_derives_tokens_under_the_key_on_disk(store):
    running = SandboxSettings(store)  # as `execbox serve` builds it: keys from the key file
    rows = SandboxStore(store.e2b, lambda: running.keyring)
    a = _key_file_id(store) if (store.data_dir / crypto.KEY_FILE).exists() else None
    assert _save(running, "sk-live-secret-number-one-0001") == (a or _key_file_id(store))
    a = _key_file_id(store)
    sb_a = _create(rows, "made-under-a")

    secrets_cli._rotate_key_file(store, crypto.generate_key())  # `execbox secrets rotate` elsewhere
    b = _key_file_id(store)
    assert b != a
    assert _save(running, "sk-live-secret-number-two-0002") == b  # not the retired key a
    sb_b = _create(rows, "made-under-b")
    assert _env_key_id(store, sb_b) == b
    fresh = _restarted(store)
    assert sb_b.access_token == fresh.tokens(sb_b.sandbox_id)[0]  # the token a restarted replica hands out
    # the replaced key is kept: what was made under it still decrypts, its token still opens
    again_a = rows.sandbox(store.e2b.get(sb_a.sandbox_id))
    assert again_a.env_vars == {"API_TOKEN": "made-under-a"} and again_a.token_ok(sb_a.access_token)

    secrets_cli._rotate_key_file(store, crypto.generate_key())
    c = _key_file_id(store)
    assert _save(running, "sk-live-secret-number-three-03") == c
    sb_c = _create(rows, "made-under-c")
    assert _env_key_id(store, sb_c) == c
    assert rows.sandbox(store.e2b.get(sb_b.sandbox_id)).token_ok(sb_b.access_token)  # b is the previous key now

    # a restart: every secret decrypts, every token made since the last rotation opens
    fresh = _restarted(store)
    for sb, value in ((sb_a, "made-under-a"), (sb_b, "made-under-b"), (sb_c, "made-under-c")):
        assert fresh.sandbox(store.e2b.get(sb.sandbox_id)).env_vars == {"API_TOKEN": value}
    assert fresh.sandbox(store.e2b.get(sb_c.sandbox_id)).token_ok(sb_c.access_token)
    assert fresh.sandbox(store.e2b.get(sb_b.sandbox_id)).token_ok(sb_b.access_token)
    assert SandboxSettings(store).decrypted("self_managed")["api_key"] == "sk-live-secret-number-three-03"
    secrets_cli._rotate_key_file(store, crypto.generate_key())  # and a third rotation works
    assert SandboxSettings(store).key_ids_in_use() == {_key_file_id(store)}


def test_the_key_files_are_read_again_only_when_they_change(store, monkeypatch):
    running = SandboxSettings(store)
    rows = SandboxStore(store.e2b, lambda: running.keyring)
    _save(running, "sk-live-secret-number-one-0001")  # makes the key file (first use)
    rows.tokens("abc")  # the key file appeared since the first load: read once more
    loads = []
    real = sandbox_settings_module.load_keyring
    monkeypatch.setattr(sandbox_settings_module, "load_keyring", lambda *a, **k: loads.append(1) or real(*a, **k))
    for _ in range(20):
        rows.tokens("abc")
        running.decrypted("self_managed")
    assert loads == []  # a stat per use, no reload
    secrets_cli._rotate_key_file(store, crypto.generate_key())
    loads.clear()  # the rotation's own loads
    rows.tokens("abc")
    assert len(loads) == 1
    rows.tokens("abc")
    assert len(loads) == 1


def test_insert_uses_one_key_ring_for_the_token_and_the_env_vars(store):
    settings = SandboxSettings(store)
    rings = []

    def ring() -> crypto.KeyRing:
        rings.append(settings.keyring)
        return rings[-1]

    sb = _create(SandboxStore(store.e2b, ring), "v")
    assert len(rings) == 1
    assert sb.access_token == persist._token(rings[0].primary, sb.sandbox_id)
    assert _env_key_id(store, sb) == rings[0].primary_id


def test_a_new_key_file_appears_only_whole(tmp_path, monkeypatch):
    """Processes reload as soon as secret.key.new appears: it must never be seen empty."""
    path = tmp_path / crypto.PENDING_KEY_FILE
    seen = []
    real = crypto.os.fsync

    def fsync(fd):  # noqa: ANN001, ANN202
        seen.append(path.exists())
        return real(fd)

    monkeypatch.setattr(crypto.os, "fsync", fsync)
    key = crypto.generate_key()
    crypto.write_key_file(path, key)
    assert seen and seen[0] is False  # the key was on disk before the name existed
    assert crypto.read_key_file(path) == key and oct(path.stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir()) == [crypto.PENDING_KEY_FILE]
    with pytest.raises(FileExistsError):
        crypto.write_key_file(path, crypto.generate_key())
    assert crypto.read_key_file(path) == key


def test_a_key_file_renamed_while_the_ring_loads_is_not_an_error(tmp_path, monkeypatch):
    for var in ("EXECBOX_SECRET_KEY", "EXECBOX_SECRET_KEY_PREVIOUS"):
        monkeypatch.delenv(var, raising=False)
    crypto.write_key_file(tmp_path / crypto.KEY_FILE, crypto.generate_key())
    new = crypto.generate_key()
    crypto.write_key_file(tmp_path / crypto.PENDING_KEY_FILE, new)
    real = crypto.read_key_file

    def racing(path):  # noqa: ANN001, ANN202
        if path.name == crypto.PENDING_KEY_FILE:  # the rotation's last step lands right now
            os.replace(path, path.with_name(crypto.KEY_FILE))
        return real(path)

    monkeypatch.setattr(crypto, "read_key_file", racing)
    assert crypto.load_keyring(tmp_path).primary == new
