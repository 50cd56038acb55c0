"""initial schema: system_settings, tokens, audit

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_TIME = sa.Float(precision=53)


def upgrade() -> None:
    op.create_table(
        "system_settings",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("data_type", sa.String(32), nullable=False),
        sa.Column("value", sa.Text, nullable=False),
        sa.Column("update_time", _TIME, nullable=False),
    )
    op.create_index("ix_system_settings_update_time", "system_settings", ["update_time"])
    # Sentinel row every writer updates first: serialises writers on every database.
    op.bulk_insert(sa.table("system_settings", sa.column("name"), sa.column("source"), sa.column("data_type"),
                            sa.column("value"), sa.column("update_time", _TIME)),
                   [{"name": "_store.write_lock", "source": "lock", "data_type": "string", "value": "",
                     "update_time": 0.0}])
    op.create_table(
        "tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("last4", sa.String(4), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("name", sa.String(128), nullable=True),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("revoked_at", _TIME, nullable=True),
    )
    op.create_index("ix_tokens_tenant_id", "tokens", ["tenant_id"])
    op.create_table(
        "audit",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
                  autoincrement=True),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("provider", sa.String(64), nullable=True),
        sa.Column("operation", sa.String(64), nullable=False),
        sa.Column("instance_id", sa.String(256), nullable=True),
        sa.Column("language", sa.String(32), nullable=True),
        sa.Column("code_hash", sa.String(64), nullable=True),
        sa.Column("duration_ms", sa.Float, nullable=True),
        sa.Column("status", sa.String(32), nullable=True),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("memory_used_mb", sa.Float, nullable=True),
        sa.Column("error_code", sa.String(16), nullable=True),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("code", sa.Text, nullable=True),
    )
    op.create_index("ix_audit_tenant_id", "audit", ["tenant_id"])
    op.create_index("ix_audit_created_at", "audit", ["created_at"])


def downgrade() -> None:
    op.drop_table("audit")
    op.drop_table("tokens")
    op.drop_table("system_settings")
