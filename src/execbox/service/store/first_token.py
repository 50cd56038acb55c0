"""The first-start admin token: made once per store, however many processes start at once.

``execbox serve`` calls :func:`create_first_admin_token` after its startup checks passed. The
check (no live token) and the insert are one transaction under the store's write lock (the
sentinel row that also serialises settings writes and first-boot seeding: SQLite's database write
lock, a row lock on PostgreSQL and MySQL), so of several first starts on one store exactly one
creates and prints a token; the others find it.
"""

from __future__ import annotations

from sqlalchemy.orm import sessionmaker

from .engine import Store
from .repos import TokenRecord, TokensRepo, _lock_for_write

FIRST_TOKEN_TENANT = "default"
FIRST_TOKEN_NAME = "first-start admin"


def create_first_admin_token(store: Store) -> tuple[TokenRecord, str] | None:
    """``(record, plaintext)`` of a new admin token for tenant ``default`` when the store has no
    live token, else None. Atomic: see the module's docstring."""
    with store.engine.connect() as conn, conn.begin():
        # Sessions that join this connection's transaction: their commits are not the real one,
        # which happens (or rolls back) when the ``conn.begin()`` block ends.
        sessions = sessionmaker(bind=conn, expire_on_commit=False,
                                join_transaction_mode="conditional_savepoint")
        with sessions() as s:
            _lock_for_write(s)  # the transaction's first statement (SQLite takes its write lock)
        tokens = TokensRepo(sessions)
        if tokens.count():
            return None
        return tokens.create(FIRST_TOKEN_TENANT, "admin", FIRST_TOKEN_NAME)


__all__ = ["FIRST_TOKEN_NAME", "FIRST_TOKEN_TENANT", "create_first_admin_token"]
