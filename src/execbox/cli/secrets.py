"""``execbox secrets rotate|status``: the AES-256-GCM key that protects stored provider secrets."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from ..errors import InvalidConfigError, SandboxError
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
    """Re-encrypt every stored secret (provider secrets and E2B sandboxes' env vars) under a new
    key, in one transaction.

    Key file (no EXECBOX_SECRET_KEY): a new key is generated, the secrets re-encrypted, then the key
    file replaced; running processes on the host pick the new key up at their next use of it. The
    replaced key is kept in secret.key.previous (decrypt only: E2B access tokens made under it keep
    working) until the next rotation. An interrupted rotation loses nothing; run it again. With
    EXECBOX_SECRET_KEY: secrets are re-encrypted under that key (older keys given in
    EXECBOX_SECRET_KEY_PREVIOUS still decrypt), or under the new key given, which you then deploy.
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
    """1) the new key on disk as secret.key.new (whole, fsynced: every process can decrypt with
    it), 2) one transaction re-encrypts every stored secret (provider rows and E2B env vars) under
    it, 3) the replaced key kept as secret.key.previous, 4) an atomic rename to secret.key.

    Kept true at every instant, so a kill at any point (any number of times) loses nothing: each
    key a stored secret uses is in secret.key, secret.key.new or secret.key.previous. A key file
    is replaced (step 3) only after the database shows no stored secret still uses its key, and
    a secret.key.new is never deleted: the next run finishes its rotation (re-encrypting what is
    not yet under it) or sets it aside. Rotations on one data directory take turns (a lock)."""
    from ..service import crypto
    from ..service.store.sandbox_settings import SandboxSettings

    path = store.data_dir / crypto.KEY_FILE
    pending = store.data_dir / crypto.PENDING_KEY_FILE
    with _rotation_lock(store.data_dir):
        if pending.exists():
            left = crypto.read_key_file(pending)
            settings = SandboxSettings(store)
            in_use = settings.key_ids_in_use()
            if crypto.key_id(left) in in_use:
                # an earlier rotation committed and stopped before its rename: finish it first
                if in_use - {crypto.key_id(left)}:
                    # secrets under other keys too (re-encrypted row by row by an older execbox, or
                    # saved meanwhile by a process on the replaced key): all under `left` first
                    settings.reencrypt_all(crypto.KeyRing(left, str(pending), []))
                if path.exists():
                    _keep_as_previous(store, settings, crypto.read_key_file(path), left)
                os.replace(pending, path)
                crypto.sync_dir(store.data_dir)
                typer.echo(f"finished an earlier rotation to key {crypto.key_id(left)} ({path})", err=True)
            else:  # it never committed: nothing uses it, but it is set aside, never deleted
                aside = pending.with_name(f"{crypto.PENDING_KEY_FILE}.unused-{int(time.time())}")
                n = 1
                while aside.exists():  # two in one second: neither overwrites the other
                    aside, n = pending.with_name(f"{crypto.PENDING_KEY_FILE}.unused-{int(time.time())}-{n}"), n + 1
                os.replace(pending, aside)
                typer.echo(f"an earlier rotation never committed; its key is kept in {aside}", err=True)
        settings = SandboxSettings(store)
        old = settings.keyring
        crypto.write_key_file(pending, key)
        count = settings.reencrypt_all(crypto.KeyRing(key, str(path), []))
        _keep_as_previous(store, settings, old.primary, key)
        os.replace(pending, path)
        crypto.sync_dir(store.data_dir)
    typer.echo(f"re-encrypted {count} secret(s); key {old.primary_id} -> {crypto.key_id(key)} ({path})")


def _keep_as_previous(store: Any, settings: Any, keep: bytes, primary: bytes) -> None:
    """secret.key.previous := ``keep``. The key it held is dropped only when no stored secret uses
    it any more: one a process still on that key saved after the re-encryption is re-encrypted
    under ``primary`` first; if one still appears, SB002 and nothing is dropped."""
    from ..service import crypto

    previous = store.data_dir / crypto.PREVIOUS_KEY_FILE
    if previous.exists():
        dropped = crypto.key_id(crypto.read_key_file(previous))
        if dropped not in (crypto.key_id(keep), crypto.key_id(primary)) and dropped in settings.key_ids_in_use():
            settings.reencrypt_all(crypto.KeyRing(primary, str(store.data_dir / crypto.PENDING_KEY_FILE), []))
            if dropped in settings.key_ids_in_use():
                raise crypto.SecretKeyError(
                    f"stored secrets are still being saved under key {dropped} ({previous}); it is kept. "
                    "Restart the execbox processes that still use it, then run `execbox secrets rotate` again.",
                    details={"path": str(previous), "key_id": dropped})
    crypto.replace_key_file(previous, keep)


@contextmanager
def _rotation_lock(directory: Path) -> Iterator[None]:
    """One key-file rotation at a time per data directory (an flock on the directory itself,
    released by the kernel if the process dies)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InvalidConfigError(f"another `execbox secrets rotate` is running on {directory}; "
                                     "let it finish, then run this one again",
                                     details={"path": str(directory)}, http_status=409) from None
        remove_stale_key_temps(directory)
        yield
    finally:
        os.close(fd)


def remove_stale_key_temps(directory: Path) -> list[str]:
    """Key files half-written by a process that was killed (``<name>.tmp-<pid>-<random>``, see
    crypto.write_key_file): never read, but each holds a key. One whose writer lives is left."""
    removed = []
    for path in directory.glob("secret.key*.tmp-*-*"):
        try:
            pid = int(path.name.rsplit(".tmp-", 1)[1].split("-", 1)[0])
        except ValueError:
            continue
        try:
            os.kill(pid, 0)
            continue  # its writer is alive (a service starting now writes its first key)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed


@secrets_app.command("status")
def status() -> None:
    """Show where the key comes from and its id (never the key), and check every stored secret
    against it: exits 2 (SB002, naming the key each needs) when one cannot be decrypted, as after
    restoring a database without its key or setting the wrong EXECBOX_SECRET_KEY."""
    from ..providers import registry
    from ..service import crypto
    from ..service.store.sandbox_settings import SandboxSettings

    problems: list[SandboxError] = []
    try:
        with store_from_cli() as store:
            settings = SandboxSettings(store)
            ring = settings.keyring
            typer.echo(f"key source: {ring.source}")
            typer.echo(f"key id:     {ring.primary_id}")
            typer.echo(f"old keys:   {len(ring.others)}")
            in_use = settings.key_ids_in_use()
            typer.echo(f"in use:     {', '.join(sorted(in_use)) or '(no stored secrets)'}")
            for name in registry.provider_names():  # decrypting is the whole check: key id and data
                try:
                    settings.decrypted(name)
                except SandboxError as e:
                    problems.append(e)
            missing = sorted(in_use - {ring.primary_id, *(crypto.key_id(k) for k in ring.others)})
            if missing and not problems:  # e.g. only E2B sandboxes' env vars use it
                problems.append(InvalidConfigError(
                    f"stored secrets are encrypted with key(s) {', '.join(missing)}, but the configured key "
                    f"({ring.source}) is {ring.primary_id}. Set EXECBOX_SECRET_KEY (or restore the key file) to "
                    "the key used when they were saved.",
                    details={"key_ids": missing, "configured_key_id": ring.primary_id}))
    except SandboxError as e:
        fail(e)
    for problem in problems:
        typer.echo(f"execbox: {problem.code}: {problem.message}", err=True)
    if problems:
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.add_typer(secrets_app, name="secrets")
