"""The settings store: SQLite file in the data dir by default, PostgreSQL/MySQL by URL.

``open_store()`` connects, runs the Alembic migrations shipped in this package and returns a
``Store`` with the repositories ``settings``, ``tokens`` and ``audit``.
"""

from __future__ import annotations

from .engine import Store, data_dir_path, database_url, open_store, redact_url, upgrade
from .repos import AuditRepo, SettingRecord, SettingsRepo, TokenRecord, TokensRepo, hash_token

__all__ = [
    "AuditRepo", "SettingRecord", "SettingsRepo", "Store", "TokenRecord", "TokensRepo",
    "data_dir_path", "database_url", "hash_token", "open_store", "redact_url", "upgrade",
]
