"""Secrets at rest: AES-256-GCM for ``secret: true`` config fields.

Key source, in order: ``EXECBOX_SECRET_KEY`` (32 random bytes, base64 or hex encoded: create one
with ``python -c "import os,base64;print(base64.b64encode(os.urandom(32)).decode())"``), else the
key file ``<data dir>/secret.key``, generated on first use with mode 0600. Extra keys that may
still decrypt (never encrypt): ``EXECBOX_SECRET_KEY_PREVIOUS`` (comma-separated) and a pending
``secret.key.new`` left by an interrupted rotation.

Ciphertext format: ``enc:v1:<key id>:<base64url(nonce || ciphertext+tag)>``. The key id (first 8
hex of SHA-256 of the key) lets a wrong key fail with a clear message instead of a bare tag
mismatch; the associated data binds a ciphertext to its setting and field, so a value copied to
another field does not decrypt.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import InvalidConfigError
from ..redaction import REDACTED_PREFIX, redact, scrub  # noqa: F401 - one rule, re-exported here

PREFIX = "enc:v1:"
KEY_FILE = "secret.key"
PENDING_KEY_FILE = "secret.key.new"
PREVIOUS_KEY_FILE = "secret.key.previous"  # the key a rotation replaced (decrypt only)
_REDACTED = re.compile(r"^\*{4}.{0,4}$", re.DOTALL)


class SecretKeyError(InvalidConfigError):
    """The secret key is missing, malformed, or not the one the data was encrypted with."""

    http_status = 500


def parse_key(text: str, source: str = "EXECBOX_SECRET_KEY") -> bytes:
    """32 bytes from base64 (standard or url-safe) or 64 hex characters."""
    raw = text.strip()
    candidates: list[bytes] = []
    if re.fullmatch(r"[0-9a-fA-F]{64}", raw):
        candidates.append(bytes.fromhex(raw))
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            candidates.append(decode(raw + "=" * (-len(raw) % 4)))
        except (binascii.Error, ValueError):
            pass
    for key in candidates:
        if len(key) == 32:
            return key
    raise SecretKeyError(
        f"{source} is not a valid key: it must be 32 random bytes encoded as base64 (44 characters) or hex "
        "(64 characters)", details={"field": source})


def encode_key(key: bytes) -> str:
    return base64.b64encode(key).decode("ascii")


def generate_key() -> bytes:
    return os.urandom(32)


def key_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:8]


def is_redacted(value: Any) -> bool:
    return isinstance(value, str) and bool(_REDACTED.match(value))


def is_encrypted(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


@dataclass
class KeyRing:
    """The key that encrypts, plus older keys that may still decrypt."""

    primary: bytes
    source: str = "EXECBOX_SECRET_KEY"
    others: list[bytes] = field(default_factory=list)

    @property
    def primary_id(self) -> str:
        return key_id(self.primary)

    def _by_id(self) -> dict[str, bytes]:
        keys = {key_id(k): k for k in self.others}
        keys[self.primary_id] = self.primary
        return keys

    def encrypt(self, plaintext: str, aad: str) -> str:
        nonce = os.urandom(12)
        ct = AESGCM(self.primary).encrypt(nonce, plaintext.encode("utf-8"), aad.encode("utf-8"))
        return f"{PREFIX}{self.primary_id}:{base64.urlsafe_b64encode(nonce + ct).decode('ascii')}"

    def decrypt(self, token: str, aad: str) -> str:
        if not is_encrypted(token):
            raise SecretKeyError(f"{aad}: stored value is not an execbox ciphertext", details={"field": aad})
        try:
            kid, blob = token[len(PREFIX):].split(":", 1)
            data = base64.urlsafe_b64decode(blob.encode("ascii"))
        except (ValueError, binascii.Error):
            raise SecretKeyError(f"{aad}: stored ciphertext is malformed", details={"field": aad}) from None
        key = self._by_id().get(kid)
        if key is None:
            raise SecretKeyError(
                f"cannot decrypt {aad}: it was encrypted with key {kid}, but the configured key "
                f"({self.source}) is {self.primary_id}. Set EXECBOX_SECRET_KEY (or restore the key file) "
                "to the key used when the secret was saved, or re-enter the secret.",
                details={"field": aad, "key_id": kid, "configured_key_id": self.primary_id})
        try:
            return AESGCM(key).decrypt(data[:12], data[12:], aad.encode("utf-8")).decode("utf-8")
        except (InvalidTag, ValueError):
            raise SecretKeyError(f"cannot decrypt {aad}: the ciphertext was altered or belongs to "
                                 "another field", details={"field": aad, "key_id": kid}) from None


def read_key_file(path: Path) -> bytes:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise SecretKeyError(f"key file {path} is readable by other users (mode {mode:o}); "
                             f"run chmod 600 {path}", details={"path": str(path)})
    return parse_key(path.read_text(), str(path))


def replace_key_file(path: Path, key: bytes) -> None:
    """Write ``path`` atomically (a temporary file of mode 0600, fsynced, then renamed over it,
    then the directory fsynced): a reader sees the old key or the new one, never a torn file."""
    tmp = _write_temporary(path, key)
    try:
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    sync_dir(path.parent)


def write_key_file(path: Path, key: bytes) -> None:
    """Create ``path`` with mode 0600 from the start (never world-readable, even briefly), whole
    or not at all: the key is written and fsynced under a temporary name, then hard-linked to
    ``path`` (FileExistsError when ``path`` exists), so a process reloading its keys at that
    moment never reads an empty key file."""
    tmp = _write_temporary(path, key)
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise
        except OSError:  # a file system without hard links: exclusive create, written in place
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(encode_key(key) + "\n")
                f.flush()
                os.fsync(f.fileno())
    finally:
        tmp.unlink(missing_ok=True)
    sync_dir(path.parent)


def _write_temporary(path: Path, key: bytes) -> Path:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(encode_key(key) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return tmp


def sync_dir(directory: Path) -> None:
    """fsync a directory, so a key file created or renamed in it survives a power loss (the
    database commit that needs that key may be on disk already)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # not supported here (some network file systems): nothing more to do
    finally:
        os.close(fd)


def ciphertext_key_id(token: str) -> str | None:
    """The id of the key an ``enc:v1:<id>:...`` value was encrypted with."""
    if not is_encrypted(token):
        return None
    return token[len(PREFIX):].split(":", 1)[0]


def load_keyring(data_dir: str | os.PathLike[str], env: dict[str, str] | None = None,
                 create: bool = True, needed: set[str] | frozenset[str] = frozenset()) -> KeyRing:
    """The key ring: ``EXECBOX_SECRET_KEY`` or the key file, plus the decrypt-only keys (the
    previous env keys, a rotation's pending and previous key files).

    A missing key file is generated only while no stored value needs a key (``needed``: the key
    ids of the stored ciphertexts): a fresh key next to secrets encrypted under the lost one
    would make them unreadable and, once anything is saved, leave the store under two keys."""
    env = dict(os.environ) if env is None else env
    directory = Path(data_dir)
    others: list[bytes] = []
    for i, part in enumerate(p for p in env.get("EXECBOX_SECRET_KEY_PREVIOUS", "").split(",") if p.strip()):
        others.append(parse_key(part, f"EXECBOX_SECRET_KEY_PREVIOUS[{i}]"))
    for name in (PENDING_KEY_FILE, PREVIOUS_KEY_FILE):
        try:
            others.append(read_key_file(directory / name))
        except FileNotFoundError:
            pass  # none, or a rotation renamed it a moment ago (its key is secret.key then)
    if env.get("EXECBOX_SECRET_KEY", "").strip():
        return KeyRing(parse_key(env["EXECBOX_SECRET_KEY"]), "EXECBOX_SECRET_KEY", others)
    path = directory / KEY_FILE
    if not path.exists():
        if not create:
            raise SecretKeyError(f"no secret key: set EXECBOX_SECRET_KEY or create {path}",
                                 details={"path": str(path)})
        missing = sorted(set(needed) - {key_id(k) for k in others})
        if missing:
            raise SecretKeyError(
                f"the key file {path} is missing, but stored secrets are encrypted with key(s) "
                f"{', '.join(missing)}: restore the key file (it is backed up with the database), or set "
                "EXECBOX_SECRET_KEY to that key. No new key is made, so nothing is saved under a second key.",
                details={"path": str(path), "key_ids": missing})
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            write_key_file(path, generate_key())
        except FileExistsError:
            pass  # another process created it first: use theirs
    return KeyRing(read_key_file(path), str(path), others)


def rewrite_secrets(values: dict[str, Any], transform: Callable[[str, str], str],
                    prefix: str = "") -> dict[str, Any]:
    """Apply ``transform(ciphertext, aad)`` to every encrypted string in a JSON object."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        out[k] = transform(v, f"{prefix}{k}") if is_encrypted(v) else v
    return out


def secret_fields(schema: dict[str, dict[str, Any]]) -> Iterable[str]:
    return [k for k, spec in schema.items() if spec.get("secret")]
