"""The ``e2b_sandboxes`` table (migration 0006): the E2B endpoint's sandboxes, shared by replicas.

Rows are plain column dicts; service/e2b_compat/registry.py turns them into sandboxes (and
decrypts their env vars). Every method is one short transaction, but ``reencrypt_env_vars``, which
runs in its caller's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from .models import E2BSandboxRow

COLUMNS = ("sandbox_id", "tenant_id", "template", "meta", "env_vars", "token_id", "started_at", "end_at",
           "session_created", "paused_left")


def _dict(row: E2BSandboxRow) -> dict[str, Any]:
    return {c: getattr(row, c) for c in COLUMNS}


class E2BSandboxRepo:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def insert(self, fields: dict[str, Any]) -> None:
        with self._sessions.begin() as s:
            s.add(E2BSandboxRow(**{c: fields.get(c) for c in COLUMNS}))

    def get(self, sandbox_id: str) -> dict[str, Any] | None:
        with self._sessions() as s:
            row = s.get(E2BSandboxRow, sandbox_id)
            return _dict(row) if row is not None else None

    def of_tenant(self, tenant_id: str) -> list[dict[str, Any]]:
        with self._sessions() as s:
            rows = s.scalars(select(E2BSandboxRow).where(E2BSandboxRow.tenant_id == tenant_id)
                             .order_by(E2BSandboxRow.started_at))
            return [_dict(r) for r in rows]

    def due(self, now: float, limit: int = 100) -> list[dict[str, Any]]:
        """Running sandboxes whose deadline has passed (a paused one does not time out)."""
        with self._sessions() as s:
            rows = s.scalars(select(E2BSandboxRow).where(E2BSandboxRow.end_at <= now,
                                                         E2BSandboxRow.paused_left.is_(None))
                             .order_by(E2BSandboxRow.end_at).limit(limit))
            return [_dict(r) for r in rows]

    def running(self, now: float) -> list[dict[str, Any]]:
        """Sandboxes neither paused nor past their deadline (the sweeper keeps their sessions in use)."""
        with self._sessions() as s:
            rows = s.scalars(select(E2BSandboxRow).where(E2BSandboxRow.end_at > now,
                                                         E2BSandboxRow.paused_left.is_(None)))
            return [_dict(r) for r in rows]

    def token_ids(self) -> list[tuple[str, str]]:
        """(sandbox id, creating API token id) of every sandbox made with a token (the sweeper
        kills those whose token was revoked); two columns only, whatever the rows hold besides."""
        with self._sessions() as s:
            return [(r[0], r[1]) for r in s.execute(select(E2BSandboxRow.sandbox_id, E2BSandboxRow.token_id)
                                                    .where(E2BSandboxRow.token_id.is_not(None)))]

    def encrypted(self) -> list[tuple[str, str]]:
        """(sandbox id, ciphertext) of every sandbox with env vars (key rotation re-encrypts them)."""
        with self._sessions() as s:
            rows = s.scalars(select(E2BSandboxRow).where(E2BSandboxRow.env_vars != ""))
            return [(r.sandbox_id, r.env_vars) for r in rows]

    @staticmethod
    def reencrypt_env_vars(s: Session, fn: Callable[[str, str], str]) -> int:
        """In the caller's transaction ``s`` (key rotation: with the provider secrets, all or
        nothing): every sandbox's env vars ciphertext replaced by ``fn(sandbox_id, ciphertext)``.
        Returns how many rows were rewritten."""
        table = E2BSandboxRow.__table__
        rows = s.execute(select(table.c.sandbox_id, table.c.env_vars).where(table.c.env_vars != "")).all()
        params = [{"sid": sandbox_id, "value": fn(sandbox_id, value)} for sandbox_id, value in rows]
        if params:
            s.execute(update(table).where(table.c.sandbox_id == bindparam("sid")).values(env_vars=bindparam("value")),
                      params)
        return len(params)

    def update(self, sandbox_id: str, **fields: Any) -> bool:
        bad = set(fields) - set(COLUMNS[4:])
        if bad:
            raise ValueError(f"not updatable: {sorted(bad)}")
        with self._sessions.begin() as s:
            return s.execute(update(E2BSandboxRow).where(E2BSandboxRow.sandbox_id == sandbox_id)
                             .values(**fields)).rowcount > 0

    def delete(self, sandbox_id: str) -> bool:
        with self._sessions.begin() as s:
            return s.execute(delete(E2BSandboxRow).where(E2BSandboxRow.sandbox_id == sandbox_id)).rowcount > 0
