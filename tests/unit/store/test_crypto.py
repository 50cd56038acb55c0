"""AES-256-GCM secrets: key formats, key file permissions, wrong key and tampering fail clearly."""

from __future__ import annotations

import base64
import os
import stat

import pytest

from execbox.service import crypto
from execbox.service.crypto import KeyRing, SecretKeyError


def test_key_formats_base64_urlsafe_and_hex():
    key = os.urandom(32)
    for text in (base64.b64encode(key).decode(), base64.urlsafe_b64encode(key).decode().rstrip("="), key.hex()):
        assert crypto.parse_key(text) == key
    for bad in ("", "short", base64.b64encode(os.urandom(16)).decode(), "zz" * 32):
        with pytest.raises(SecretKeyError, match="32 random bytes"):
            crypto.parse_key(bad)


def test_roundtrip_uses_fresh_nonces_and_binds_the_field():
    ring = KeyRing(crypto.generate_key())
    a = ring.encrypt("hunter2-secret", "sandbox.e2b.api_key")
    b = ring.encrypt("hunter2-secret", "sandbox.e2b.api_key")
    assert a != b and a.startswith(f"enc:v1:{ring.primary_id}:") and "hunter2" not in a
    assert ring.decrypt(a, "sandbox.e2b.api_key") == "hunter2-secret"
    with pytest.raises(SecretKeyError, match="altered or belongs to another field"):
        ring.decrypt(a, "sandbox.aliyun_codeinterpreter.access_key_secret")


def test_wrong_key_names_both_key_ids():
    stored = KeyRing(crypto.generate_key()).encrypt("v", "f")
    other = KeyRing(crypto.generate_key(), "EXECBOX_SECRET_KEY")
    with pytest.raises(SecretKeyError) as e:
        other.decrypt(stored, "f")
    assert "EXECBOX_SECRET_KEY" in e.value.message and stored.split(":")[2] in e.value.message
    assert e.value.http_status == 500 and e.value.code == "SB002"


def test_tampered_ciphertext_is_refused():
    ring = KeyRing(crypto.generate_key())
    token = ring.encrypt("value", "f")
    raw = bytearray(base64.urlsafe_b64decode(token.split(":", 3)[3]))
    raw[-1] ^= 1
    forged = ":".join(token.split(":")[:3]) + ":" + base64.urlsafe_b64encode(bytes(raw)).decode()
    with pytest.raises(SecretKeyError, match="altered"):
        ring.decrypt(forged, "f")
    with pytest.raises(SecretKeyError, match="malformed"):
        ring.decrypt("enc:v1:nocolon", "f")


def test_previous_keys_decrypt_but_never_encrypt():
    old, new = crypto.generate_key(), crypto.generate_key()
    token = KeyRing(old).encrypt("v", "f")
    ring = KeyRing(new, others=[old])
    assert ring.decrypt(token, "f") == "v"
    assert ring.encrypt("v", "f").split(":")[2] == crypto.key_id(new)


def test_key_file_generated_0600_and_reused(tmp_path):
    ring = crypto.load_keyring(tmp_path, env={})
    path = tmp_path / crypto.KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert crypto.load_keyring(tmp_path, env={}).primary == ring.primary
    path.chmod(0o644)
    with pytest.raises(SecretKeyError, match="chmod 600"):
        crypto.load_keyring(tmp_path, env={})


def test_env_key_wins_and_bad_env_key_is_clear(tmp_path):
    key = crypto.generate_key()
    ring = crypto.load_keyring(tmp_path, env={"EXECBOX_SECRET_KEY": key.hex()})
    assert ring.primary == key and not (tmp_path / crypto.KEY_FILE).exists()
    with pytest.raises(SecretKeyError, match="EXECBOX_SECRET_KEY"):
        crypto.load_keyring(tmp_path, env={"EXECBOX_SECRET_KEY": "not-a-key"})


def test_redaction_shows_at_most_the_last_four():
    assert crypto.redact("sk-0123456789abcd") == "****abcd"
    assert crypto.redact("short") == "****"  # too short to reveal any of it
    assert crypto.redact("") == ""
    assert crypto.is_redacted("****abcd") and crypto.is_redacted("****")
    assert not crypto.is_redacted("sk-****abcd")
