"""`execbox secrets rotate` really killed (SIGKILL, at a chosen encryption) twice in a row, then
run to the end: every stored secret still decrypts (the crash-consistency review's scenario:
killed at 1.0 s and 1.5 s, then "cannot decrypt ... encrypted with key 9d8827ec" for good). And
the re-encryption is one transaction on every database: SQLite and PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from execbox.service import crypto
from execbox.service.e2b_compat.persist import SandboxStore
from execbox.service.e2b_compat.registry import E2BSandbox, new_sandbox_id
from execbox.service.store import open_store
from execbox.service.store.sandbox_settings import SandboxSettings

EXECBOX = str(Path(sys.executable).with_name("execbox"))
SECRET = "sk-live-0123456789abcdef-WXYZ"
ROWS = 60

# `execbox secrets rotate`, SIGKILLed by itself at its N-th encryption (1: the provider secret,
# 2..: the E2B rows, in the middle of the transaction)
_KILLED_ROTATE = """
import os, signal, sys
from execbox.service import crypto
from execbox.cli import main
at, seen, real = int(sys.argv[1]), [0], crypto.KeyRing.encrypt
def encrypt(self, plaintext, aad):
    seen[0] += 1
    if seen[0] == at:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, plaintext, aad)
crypto.KeyRing.encrypt = encrypt
sys.argv = ["execbox", "secrets", "rotate"]
main()
"""


def _fill(store) -> None:
    settings = SandboxSettings(store)
    settings.save("self_managed", settings.validate("self_managed", {"endpoint": "http://127.0.0.1:9",
                                                                      "api_key": SECRET}))
    rows = SandboxStore(store.e2b, lambda: settings.keyring)
    for i in range(ROWS):
        rows.insert(E2BSandbox(new_sandbox_id(), "t1", "base", {}, {"K": f"v{i}"}, time.time() + 3600))


def _assert_all_decryptable(store) -> None:
    ring = crypto.load_keyring(store.data_dir, env={}, create=False)  # what a process starting now has
    assert SandboxSettings(store, ring).decrypted("self_managed")["api_key"] == SECRET
    values = sorted(ring.decrypt(v, f"e2b_sandboxes.{sid}.env_vars") for sid, v in store.e2b.encrypted())
    assert values == sorted(f'{{"K": "v{i}"}}' for i in range(ROWS))


def test_rotate_sigkilled_twice_mid_reencryption_then_run_again(tmp_path):
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SANDBOX_", "EXECBOX_", "E2B_"))}
    env["EXECBOX_DATA_DIR"] = str(data)
    with open_store(data) as store:
        _fill(store)
        for at in (1 + ROWS // 2, 1 + ROWS // 4):
            p = subprocess.run([sys.executable, "-c", _KILLED_ROTATE, str(at)], env=env, capture_output=True,
                               text=True, timeout=120)
            assert p.returncode == -signal.SIGKILL, p.stderr
            _assert_all_decryptable(store)
        p = subprocess.run([EXECBOX, "secrets", "rotate"], env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert f"re-encrypted {ROWS + 1} secret(s)" in p.stdout
        _assert_all_decryptable(store)
        assert SandboxSettings(store).key_ids_in_use() == {
            crypto.key_id(crypto.read_key_file(data / crypto.KEY_FILE))}


class _Stop(BaseException):
    pass


def test_reencryption_is_one_transaction(db_url, tmp_path, monkeypatch):
    for var in ("EXECBOX_SECRET_KEY", "EXECBOX_SECRET_KEY_PREVIOUS"):
        monkeypatch.delenv(var, raising=False)
    with open_store(tmp_path, url=db_url) as store:
        _fill(store)
        before = (store.settings.get("sandbox.self_managed"), dict(store.e2b.encrypted()), store.settings.version())
        new = crypto.generate_key()
        real, seen = crypto.KeyRing.encrypt, [0]

        def encrypt(self, plaintext, aad):  # noqa: ANN001, ANN202
            seen[0] += 1
            if seen[0] == 1 + ROWS // 2:
                raise _Stop
            return real(self, plaintext, aad)

        with monkeypatch.context() as m:
            m.setattr(crypto.KeyRing, "encrypt", encrypt)
            with pytest.raises(_Stop):
                SandboxSettings(store).reencrypt_all(crypto.KeyRing(new, "new"))
        assert (store.settings.get("sandbox.self_managed"), dict(store.e2b.encrypted()),
                store.settings.version()) == before
        assert SandboxSettings(store).reencrypt_all(crypto.KeyRing(new, "new")) == ROWS + 1
        assert SandboxSettings(store).key_ids_in_use() == {crypto.key_id(new)}
        assert store.settings.version() > before[2]  # replicas see the change and reload
