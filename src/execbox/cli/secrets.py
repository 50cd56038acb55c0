"""``execbox secrets rotate|status``: the AES-256-GCM key that protects stored provider secrets."""

from __future__ import annotations

import os

import typer

from ..errors import SandboxError
from ._store_cli import fail, store_from_cli

secrets_app = typer.Typer(help="Key management for secrets stored in the settings database.",
                          no_args_is_help=True)


@secrets_app.command("rotate")
def rotate(
    new_key: str | None = typer.Option(None, "--new-key", envvar="EXECBOX_NEW_SECRET_KEY",
                                       help="Use this key (base64 or hex of 32 bytes) instead of a fresh one."),
) -> None:
    """Re-encrypt every stored secret under a new key, in one transaction.

    Key file (no EXECBOX_SECRET_KEY): a new key is generated, the secrets re-encrypted, then the key
    file replaced. With EXECBOX_SECRET_KEY: secrets are re-encrypted under that key (older keys given
    in EXECBOX_SECRET_KEY_PREVIOUS still decrypt), or under --new-key, which is printed for you to
    deploy.
    """
    from ..service import crypto
    from ..service.store.sandbox_settings import SandboxSettings

    try:
        with store_from_cli() as store:
            settings = SandboxSettings(store)
            old = settings.keyring
            env_key = bool(os.environ.get("EXECBOX_SECRET_KEY", "").strip())
            if env_key:
                key = crypto.parse_key(new_key, "--new-key") if new_key else old.primary
                new = crypto.KeyRing(key, "EXECBOX_SECRET_KEY", [])
                count = settings.reencrypt_all(new)
                typer.echo(f"re-encrypted {count} secret(s) under key {new.primary_id}")
                if new_key:
                    typer.echo("now set EXECBOX_SECRET_KEY to the new key on every execbox process "
                               "(keep the old one in EXECBOX_SECRET_KEY_PREVIOUS until all have restarted)",
                               err=True)
                return
            path = store.data_dir / crypto.KEY_FILE
            pending = store.data_dir / crypto.PENDING_KEY_FILE
            key = crypto.parse_key(new_key, "--new-key") if new_key else crypto.generate_key()
            if pending.exists():
                pending.unlink()  # a previous rotation that never committed
            # 1) pending key on disk (every process can decrypt with it), 2) one transaction,
            # 3) atomic rename. A crash at any point leaves every secret decryptable.
            crypto.write_key_file(pending, key)
            count = settings.reencrypt_all(crypto.KeyRing(key, str(path), [old.primary]))
            os.replace(pending, path)
            typer.echo(f"re-encrypted {count} secret(s); key {old.primary_id} -> {crypto.key_id(key)} ({path})")
    except SandboxError as e:
        fail(e)


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
