"""``execbox secrets rotate|status``: the AES-256-GCM key that protects stored provider secrets."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import typer

from ..errors import SandboxError
from ._store_cli import fail, store_from_cli

secrets_app = typer.Typer(help="Key management for secrets stored in the settings database.",
                          no_args_is_help=True)


@secrets_app.command("rotate")
def rotate(
    new_key_file: Path | None = typer.Option(
        None, "--new-key-file", help="Use the key in this file (base64 or hex of 32 bytes) instead of a fresh "
                                     "one; or set EXECBOX_NEW_SECRET_KEY. Never on the command line: every "
                                     "local user can read a process's arguments."),
) -> None:
    """Re-encrypt every stored secret under a new key, in one transaction.

    Key file (no EXECBOX_SECRET_KEY): a new key is generated, the secrets re-encrypted, then the key
    file replaced; the replaced key is kept in secret.key.previous (decrypt only) for processes
    that have not reloaded yet. With EXECBOX_SECRET_KEY: secrets are re-encrypted under that key
    (older keys given in EXECBOX_SECRET_KEY_PREVIOUS still decrypt), or under the new key given,
    which you then deploy.
    """
    from ..service import crypto

    try:
        new_key = _new_key(new_key_file)
        with store_from_cli() as store:
            if os.environ.get("EXECBOX_SECRET_KEY", "").strip():
                _rotate_env_key(store, new_key)
            else:
                _rotate_key_file(store, new_key if new_key is not None else crypto.generate_key())
    except SandboxError as e:
        fail(e)


def _new_key(path: Path | None) -> bytes | None:
    from ..service import crypto

    if path is not None:
        try:
            return crypto.parse_key(path.read_text(), str(path))
        except OSError as e:
            raise SandboxError(f"cannot read --new-key-file {path}: {e.strerror}",
                               details={"path": str(path)}) from None
    env = os.environ.get("EXECBOX_NEW_SECRET_KEY", "").strip()
    return crypto.parse_key(env, "EXECBOX_NEW_SECRET_KEY") if env else None


def _rotate_env_key(store: Any, new_key: bytes | None) -> None:
    from ..service import crypto
    from ..service.store.sandbox_settings import SandboxSettings

    settings = SandboxSettings(store)
    new = crypto.KeyRing(new_key or settings.keyring.primary, "EXECBOX_SECRET_KEY", [])
    count = settings.reencrypt_all(new)
    typer.echo(f"re-encrypted {count} secret(s) under key {new.primary_id}")
    if new_key:
        typer.echo("now set EXECBOX_SECRET_KEY to the new key on every execbox process "
                   "(keep the old one in EXECBOX_SECRET_KEY_PREVIOUS until all have restarted)", err=True)


def _rotate_key_file(store: Any, key: bytes) -> None:
    """1) the new key on disk as secret.key.new (every process can decrypt with it), 2) one
    transaction, 3) the replaced key kept as secret.key.previous, 4) an atomic rename. A crash at
    any point leaves every secret decryptable, and a second run after a crash never deletes the
    key the store was re-encrypted under."""
    from ..service import crypto
    from ..service.store.sandbox_settings import SandboxSettings

    path = store.data_dir / crypto.KEY_FILE
    pending = store.data_dir / crypto.PENDING_KEY_FILE
    if pending.exists():
        left = crypto.read_key_file(pending)
        if crypto.key_id(left) in SandboxSettings(store).key_ids_in_use():
            # an earlier rotation committed and stopped before its rename: finish it first
            if path.exists():
                crypto.replace_key_file(store.data_dir / crypto.PREVIOUS_KEY_FILE, crypto.read_key_file(path))
            os.replace(pending, path)
            typer.echo(f"finished an earlier rotation to key {crypto.key_id(left)} ({path})", err=True)
        else:  # it never committed: nothing uses it, but it is set aside, never deleted
            aside = pending.with_name(f"{crypto.PENDING_KEY_FILE}.unused-{int(time.time())}")
            os.replace(pending, aside)
            typer.echo(f"an earlier rotation never committed; its key is kept in {aside}", err=True)
    settings = SandboxSettings(store)
    old = settings.keyring
    crypto.write_key_file(pending, key)
    count = settings.reencrypt_all(crypto.KeyRing(key, str(path), [old.primary]))
    crypto.replace_key_file(store.data_dir / crypto.PREVIOUS_KEY_FILE, old.primary)
    os.replace(pending, path)
    typer.echo(f"re-encrypted {count} secret(s); key {old.primary_id} -> {crypto.key_id(key)} ({path})")


@secrets_app.command("status")
def status() -> None:
    """Show where the key comes from and its id (never the key)."""
    from ..service.store.sandbox_settings import SandboxSettings

    try:
        with store_from_cli() as store:
            ring = SandboxSettings(store).keyring
            typer.echo(f"key source: {ring.source}")
            typer.echo(f"key id:     {ring.primary_id}")
            typer.echo(f"old keys:   {len(ring.others)}")
    except SandboxError as e:
        fail(e)


def register(app: typer.Typer) -> None:
    app.add_typer(secrets_app, name="secrets")
