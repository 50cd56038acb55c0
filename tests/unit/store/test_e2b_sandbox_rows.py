"""E2B sandboxes in the store (e2b_compat/persist.py): env vars encrypted, access tokens derived
(never stored), and both follow `execbox secrets rotate`."""

from __future__ import annotations

import time

from execbox.service import crypto
from execbox.service.e2b_compat.persist import SandboxStore
from execbox.service.e2b_compat.registry import E2BSandbox
from execbox.service.store import open_store
from execbox.service.store.sandbox_settings import SandboxSettings


def _sandbox() -> E2BSandbox:
    return E2BSandbox("abc123", "t", "base", {"team": "x"}, {"API_KEY": "sk-live-0123456789"}, time.time() + 60)


def test_env_vars_are_stored_encrypted_and_tokens_derived(tmp_path, monkeypatch):
    key = crypto.generate_key()
    monkeypatch.setenv("EXECBOX_SECRET_KEY", crypto.encode_key(key))
    with open_store(data_dir=tmp_path) as store:
        settings = SandboxSettings(store)
        rows = SandboxStore(store.e2b, lambda: settings.keyring)
        sb = _sandbox()
        rows.insert(sb)
        raw = store.e2b.get("abc123")
        assert crypto.is_encrypted(raw["env_vars"]) and "sk-live" not in str(raw)
        assert sb.access_token not in str(raw)  # never stored
        assert crypto.key_id(key) in settings.key_ids_in_use()  # a lost key file is not silently replaced
        again = rows.sandbox(raw)
        assert again.env_vars == {"API_KEY": "sk-live-0123456789"} and again.metadata == {"team": "x"}
        assert again.access_token == sb.access_token and again.token_ok(sb.access_token)
        assert not again.token_ok(sb.access_token[:-1] + "x") and not again.token_ok(None)


def test_rotation_reencrypts_env_vars_and_old_tokens_last_while_the_old_key_is_kept(tmp_path, monkeypatch):
    old, new = crypto.generate_key(), crypto.generate_key()
    monkeypatch.setenv("EXECBOX_SECRET_KEY", crypto.encode_key(old))
    with open_store(data_dir=tmp_path) as store:
        settings = SandboxSettings(store)
        sb = _sandbox()
        SandboxStore(store.e2b, lambda: settings.keyring).insert(sb)
        assert settings.reencrypt_all(crypto.KeyRing(new, "EXECBOX_SECRET_KEY", [])) == 1
        monkeypatch.setenv("EXECBOX_SECRET_KEY", crypto.encode_key(new))
        monkeypatch.setenv("EXECBOX_SECRET_KEY_PREVIOUS", crypto.encode_key(old))
        during = SandboxStore(store.e2b, lambda: SandboxSettings(store).keyring).sandbox(store.e2b.get("abc123"))
        assert during.token_ok(sb.access_token)  # the old key is still kept: its token still opens
        monkeypatch.delenv("EXECBOX_SECRET_KEY_PREVIOUS")
        after = SandboxStore(store.e2b, lambda: SandboxSettings(store).keyring).sandbox(store.e2b.get("abc123"))
        assert after.env_vars == {"API_KEY": "sk-live-0123456789"}  # readable under the new key alone
        assert not after.token_ok(sb.access_token) and after.token_ok(after.access_token)
        assert crypto.key_id(old) not in SandboxSettings(store).key_ids_in_use()
