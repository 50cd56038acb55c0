"""egress_audit: one row per box connection attempt through the egress gateway (issue 14)

Revision ID: 0004
Revises: 0002 (re-chained after 0003 at merge)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "egress_audit",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("ts", sa.Float(precision=53), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=True),
        sa.Column("session_id", sa.String(128), nullable=True),
        sa.Column("run_id", sa.String(128), nullable=True),
        sa.Column("box", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("host", sa.String(253), nullable=True),
        sa.Column("ip", sa.String(45), nullable=True),
        sa.Column("port", sa.Integer, nullable=True),
        sa.Column("decision", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(300), nullable=True),
        sa.Column("bytes_up", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("bytes_down", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("duration_ms", sa.Float, nullable=False, server_default="0"),
        sa.Column("injected", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_index("ix_egress_audit_ts", "egress_audit", ["ts"])
    op.create_index("ix_egress_audit_tenant_id", "egress_audit", ["tenant_id"])
    op.create_index("ix_egress_audit_decision", "egress_audit", ["decision"])


def downgrade() -> None:
    op.drop_table("egress_audit")
