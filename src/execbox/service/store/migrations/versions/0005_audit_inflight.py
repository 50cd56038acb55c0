"""audit_inflight: runs that have started and not yet been audited, so a run cut off by the
service's own end (SIGKILL, host crash) is still on record (as ``interrupted``) after a restart

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_inflight",
        sa.Column("key", sa.String(32), primary_key=True),
        sa.Column("replica", sa.String(128), nullable=False),
        sa.Column("started_at", sa.Float(precision=53), nullable=False),
        sa.Column("record", sa.Text, nullable=False),
    )
    op.create_index("ix_audit_inflight_replica", "audit_inflight", ["replica"])
    op.create_index("ix_audit_inflight_started_at", "audit_inflight", ["started_at"])


def downgrade() -> None:
    op.drop_table("audit_inflight")
