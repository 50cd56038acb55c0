"""The key file is the one thing that makes stored secrets readable: a rotation interrupted at
any point and run again never loses the key the store is encrypted under; a missing key file is
never silently replaced while secrets need the old one; the database file is private."""

from __future__ import annotations

import os
import stat

import pytest

from execbox.cli import secrets as secrets_cli
from execbox.errors import InvalidConfigError
from execbox.service import crypto
from execbox.service.store import open_store
from execbox.service.store.sandbox_settings import SandboxSettings

SECRET = "sk-live-0123456789abcdef-WXYZ"


@pytest.fixture
def store(tmp_path, monkeypatch):
    for var in ("EXECBOX_SECRET_KEY", "EXECBOX_SECRET_KEY_PREVIOUS", "EXECBOX_NEW_SECRET_KEY"):
        monkeypatch.delenv(var, raising=False)
    s = open_store(tmp_path)
    settings = SandboxSettings(s)  # the key file is made on first use, like a first start
    settings.save("self_managed", settings.validate("self_managed", {"endpoint": "http://127.0.0.1:9",
                                                                      "api_key": SECRET}))
    yield s
    s.close()


def _readable(store) -> str:
    return SandboxSettings(store).decrypted("self_managed")["api_key"]


def test_a_rotation_that_committed_but_never_renamed_its_key_is_finished_not_undone(store):
    # crash #1 after the transaction, before the rename: the store needs secret.key.new
    settings = SandboxSettings(store)
    old = settings.keyring
    pending = store.data_dir / crypto.PENDING_KEY_FILE
    key = crypto.generate_key()
    crypto.write_key_file(pending, key)
    settings.reencrypt_all(crypto.KeyRing(key, "x", [old.primary]))
    assert SandboxSettings(store).key_ids_in_use() == {crypto.key_id(key)}

    # the next rotation is interrupted too, right after it began its own transaction
    def boom(self, new):  # noqa: ANN001, ANN202
        raise KeyboardInterrupt

    real = SandboxSettings.reencrypt_all
    SandboxSettings.reencrypt_all = boom  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt):
            secrets_cli._rotate_key_file(store, crypto.generate_key())
    finally:
        SandboxSettings.reencrypt_all = real  # type: ignore[method-assign]
    # the key the store needs is the key file now (the earlier rotation was finished first)
    assert crypto.key_id(crypto.read_key_file(store.data_dir / crypto.KEY_FILE)) == crypto.key_id(key)
    assert _readable(store) == SECRET
    secrets_cli._rotate_key_file(store, crypto.generate_key())  # and a full run still works
    assert _readable(store) == SECRET and not pending.exists()


def test_a_pending_key_nothing_uses_is_set_aside_never_deleted(store):
    pending = store.data_dir / crypto.PENDING_KEY_FILE
    unused = crypto.generate_key()
    crypto.write_key_file(pending, unused)  # a rotation that stopped before its transaction
    secrets_cli._rotate_key_file(store, crypto.generate_key())
    aside = [p for p in store.data_dir.iterdir() if p.name.startswith(crypto.PENDING_KEY_FILE + ".unused-")]
    assert len(aside) == 1 and crypto.read_key_file(aside[0]) == unused
    assert _readable(store) == SECRET


def test_the_replaced_key_still_decrypts_what_a_not_yet_reloaded_process_saved(store):
    stale = SandboxSettings(store)  # a running process, holding the key before the rotation
    stale.keyring  # noqa: B018 - loaded now
    secrets_cli._rotate_key_file(store, crypto.generate_key())
    stale.save("self_managed", stale.validate("self_managed", {"endpoint": "http://127.0.0.1:9",
                                                                "api_key": SECRET + "2"}))
    assert _readable(store) == SECRET + "2"  # under the old key: secret.key.previous decrypts it


def test_a_missing_key_file_is_not_replaced_while_secrets_need_it(store):
    needed = SandboxSettings(store).key_ids_in_use()
    (store.data_dir / crypto.KEY_FILE).unlink()
    with pytest.raises(crypto.SecretKeyError) as e:
        SandboxSettings(store).keyring  # noqa: B018
    assert e.value.details["key_ids"] == sorted(needed) and "restore the key file" in str(e.value)
    assert not (store.data_dir / crypto.KEY_FILE).exists()  # no second key was made


def test_the_database_file_is_private_in_an_open_data_directory(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    with open_store(data) as s:
        SandboxSettings(s).save("self_managed", {"endpoint": "http://127.0.0.1:9"})
    for name in ("execbox.db", "execbox.db-wal", "execbox.db-shm"):
        if (data / name).exists():
            assert stat.S_IMODE((data / name).stat().st_mode) == 0o600, name


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o720])
def test_a_data_directory_others_may_write_is_refused(tmp_path, mode: int) -> None:
    """Whoever may create or rename files there could swap in their own database (their own admin
    token) or key file: the store refuses to open it, naming the fix."""
    d = tmp_path / "data"
    d.mkdir()
    os.chmod(d, mode)
    with pytest.raises(InvalidConfigError) as e:
        open_store(d)
    assert e.value.details["field"] == "EXECBOX_DATA_DIR" and "chmod 700" in e.value.message
    assert not (d / "execbox.db").exists()
    os.chmod(d, 0o755)
    open_store(d).close()  # readable by others is fine: the files in it are 0600


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directory to another user")
def test_a_data_directory_owned_by_another_user_is_refused(tmp_path) -> None:
    d = tmp_path / "data"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    with pytest.raises(InvalidConfigError) as e:
        open_store(d)
    assert "owner uid 65534" in e.value.message
