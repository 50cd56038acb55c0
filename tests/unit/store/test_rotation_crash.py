"""`execbox secrets rotate` (key file) killed at any point, any number of times in a row, never
leaves a stored secret that the key files cannot decrypt: the provider secrets and the E2B
sandboxes' env vars are re-encrypted in one transaction, and a key file is only replaced once no
stored secret uses its key.

A kill is simulated in-process: the n-th step of a rotation (an encryption, a key file made or
renamed) raises an exception no code catches, which unwinds like a SIGKILL does to the database
(the open transaction is rolled back) and stops the rotation there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from execbox.cli import secrets as secrets_cli
from execbox.errors import InvalidConfigError
from execbox.service import crypto
from execbox.service.e2b_compat.persist import SandboxStore
from execbox.service.e2b_compat.registry import E2BSandbox, new_sandbox_id
from execbox.service.store import open_store
from execbox.service.store.sandbox_settings import SandboxSettings

SECRET = "sk-live-0123456789abcdef-WXYZ"
ROWS = 12


class Killed(BaseException):
    """The rotation's process died here (BaseException: no `except Exception` stops it)."""


@pytest.fixture
def store(tmp_path, monkeypatch):
    for var in ("EXECBOX_SECRET_KEY", "EXECBOX_SECRET_KEY_PREVIOUS", "EXECBOX_NEW_SECRET_KEY"):
        monkeypatch.delenv(var, raising=False)
    s = open_store(tmp_path)
    settings = SandboxSettings(s)
    settings.save("self_managed", settings.validate("self_managed", {"endpoint": "http://127.0.0.1:9",
                                                                      "api_key": SECRET}))
    rows = SandboxStore(s.e2b, lambda: settings.keyring)
    for i in range(ROWS):
        rows.insert(E2BSandbox(new_sandbox_id(), "t1", "base", {}, {"K": f"v{i}"}, time.time() + 3600))
    yield s
    s.close()


def _ring(store) -> crypto.KeyRing:
    """The keys a process starting now has: the key files only."""
    return crypto.load_keyring(store.data_dir, env={}, create=False)


def _assert_all_decryptable(store) -> None:
    ring = _ring(store)
    assert SandboxSettings(store, ring).decrypted("self_managed")["api_key"] == SECRET
    values = sorted(ring.decrypt(v, f"e2b_sandboxes.{sid}.env_vars") for sid, v in store.e2b.encrypted())
    assert values == sorted(f'{{"K": "v{i}"}}' for i in range(ROWS))


def _key_ids(store) -> dict[str, int]:
    ids: dict[str, int] = {}
    for _sid, v in store.e2b.encrypted():
        kid = crypto.ciphertext_key_id(v)
        ids[kid] = ids.get(kid, 0) + 1
    return ids


@contextlib.contextmanager
def _killed_at(monkeypatch, step: int | None) -> Iterator[list[int]]:
    """Count a rotation's steps (encryptions, key files linked or renamed); die at ``step``."""
    seen = [0]
    real_encrypt, real_replace, real_link = crypto.KeyRing.encrypt, os.replace, os.link

    def tick() -> None:
        seen[0] += 1
        if seen[0] == step:
            raise Killed(step)

    def encrypt(self, plaintext, aad):  # noqa: ANN001, ANN202
        tick()
        return real_encrypt(self, plaintext, aad)

    def replace(src, dst):  # noqa: ANN001, ANN202
        tick()
        return real_replace(src, dst)

    def link(src, dst):  # noqa: ANN001, ANN202
        tick()
        return real_link(src, dst)

    with monkeypatch.context() as m:
        m.setattr(crypto.KeyRing, "encrypt", encrypt)
        m.setattr(os, "replace", replace)
        m.setattr(os, "link", link)
        yield seen


def _rotate(store, monkeypatch, step: int | None = None) -> bool:
    """One rotation, killed at ``step``; True when it ran to the end."""
    with _killed_at(monkeypatch, step):
        try:
            secrets_cli._rotate_key_file(store, crypto.generate_key())
        except Killed:
            return False
    return True


def test_a_rotation_killed_in_its_e2b_rows_changes_no_row(store, monkeypatch):
    before = {sid: v for sid, v in store.e2b.encrypted()}
    settings_before = store.settings.get("sandbox.self_managed")
    # step 1 makes secret.key.new, 2 re-encrypts the provider secret, 3.. the E2B rows: die halfway
    assert not _rotate(store, monkeypatch, step=3 + ROWS // 2)
    assert dict(store.e2b.encrypted()) == before and store.settings.get("sandbox.self_managed") == settings_before
    _assert_all_decryptable(store)


def test_two_rotations_killed_mid_reencryption_then_a_full_one(store, monkeypatch):
    # the crash-consistency review's run: killed at 1.0 s, again at 1.5 s, then a full rotate
    old = crypto.key_id(crypto.read_key_file(store.data_dir / crypto.KEY_FILE))
    assert not _rotate(store, monkeypatch, step=3 + ROWS // 2)
    _assert_all_decryptable(store)
    assert not _rotate(store, monkeypatch, step=3 + ROWS // 4)
    _assert_all_decryptable(store)
    assert _rotate(store, monkeypatch)
    _assert_all_decryptable(store)
    new = crypto.key_id(crypto.read_key_file(store.data_dir / crypto.KEY_FILE))
    assert _key_ids(store) == {new: ROWS} and new != old
    assert not (store.data_dir / crypto.PENDING_KEY_FILE).exists()


def test_rotations_killed_at_every_step_in_a_row_never_lose_a_secret(store, monkeypatch):
    with _killed_at(monkeypatch, None) as seen:
        secrets_cli._rotate_key_file(store, crypto.generate_key())
    steps = seen[0]
    assert steps >= ROWS + 3
    # each rotation dies at a later (then an earlier) step than the one before, so every kind of
    # leftover (a new key nothing uses, one the store is under, a half-done key file dance) meets
    # every kind of next rotation
    for step in [*range(1, steps + 2), *range(steps + 1, 0, -1)]:
        _rotate(store, monkeypatch, step)
        _assert_all_decryptable(store)
    assert _rotate(store, monkeypatch)
    _assert_all_decryptable(store)
    key = crypto.key_id(crypto.read_key_file(store.data_dir / crypto.KEY_FILE))
    assert _key_ids(store) == {key: ROWS}


def test_a_half_reencrypted_store_is_finished_under_the_pending_key_not_cut_off(store, monkeypatch):
    """What a rotation by an older execbox (E2B rows re-encrypted row by row) left when killed:
    secret.key.new in use, and rows still under the key in secret.key.previous."""
    a = crypto.read_key_file(store.data_dir / crypto.KEY_FILE)
    assert _rotate(store, monkeypatch)  # secret.key = b, secret.key.previous = a
    c = crypto.generate_key()
    crypto.write_key_file(store.data_dir / crypto.PENDING_KEY_FILE, c)
    settings = SandboxSettings(store)
    settings.reencrypt_all(crypto.KeyRing(c, "test", []))
    for sid, v in store.e2b.encrypted()[: ROWS // 2]:  # these were not reached: still under a
        aad = f"e2b_sandboxes.{sid}.env_vars"
        store.e2b.update(sid, env_vars=crypto.KeyRing(a).encrypt(settings.keyring.decrypt(v, aad), aad))
    assert crypto.key_id(a) in SandboxSettings(store).key_ids_in_use()

    assert _rotate(store, monkeypatch)
    _assert_all_decryptable(store)
    assert _rotate(store, monkeypatch)
    _assert_all_decryptable(store)


def test_a_key_still_used_after_the_reencryption_is_not_dropped(store, monkeypatch):
    """A process that loaded its keys before the last rotation saves under that key right after
    this rotation's transaction: the key it used (secret.key.previous) must not be replaced."""
    a = crypto.read_key_file(store.data_dir / crypto.KEY_FILE)
    assert _rotate(store, monkeypatch)  # secret.key.previous = a
    stale = SandboxSettings(store, crypto.KeyRing(a, "a process still on key a"))
    real = SandboxSettings.reencrypt_all
    calls = []

    def then_a_stale_save(self, new):  # noqa: ANN001, ANN202
        n = real(self, new)
        if not calls:
            stale.save("self_managed", stale.validate("self_managed", {"endpoint": "http://127.0.0.1:9",
                                                                        "api_key": SECRET}))
        calls.append(n)
        return n

    monkeypatch.setattr(SandboxSettings, "reencrypt_all", then_a_stale_save)
    assert _rotate(store, monkeypatch)
    _assert_all_decryptable(store)
    assert len(calls) == 2  # re-encrypted once more before key a left secret.key.previous
    assert crypto.key_id(a) not in SandboxSettings(store).key_ids_in_use()


def test_two_rotations_at_once_take_turns(store):
    fd = os.open(store.data_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(InvalidConfigError) as e:
            secrets_cli._rotate_key_file(store, crypto.generate_key())
        assert e.value.http_status == 409 and "another `execbox secrets rotate`" in e.value.message
    finally:
        os.close(fd)
    assert not (store.data_dir / crypto.PENDING_KEY_FILE).exists()
    _assert_all_decryptable(store)


def test_a_rotation_removes_key_temp_files_whose_writer_died(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f"secret.key.new.tmp-{dead.pid}-abcd1234").write_text("k1")
    (tmp_path / f"secret.key.tmp-{os.getpid()}-abcd1234").write_text("k2")  # a live writer's
    (tmp_path / "secret.key").write_text("kept")
    assert secrets_cli.remove_stale_key_temps(tmp_path) == [f"secret.key.new.tmp-{dead.pid}-abcd1234"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.key", f"secret.key.tmp-{os.getpid()}-abcd1234"]
