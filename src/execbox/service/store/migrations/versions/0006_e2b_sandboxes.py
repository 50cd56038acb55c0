"""e2b_sandboxes: the E2B-compatible endpoint's sandboxes (template, metadata, encrypted env vars,
deadline, pause state), so they survive a restart and every replica serves them

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "e2b_sandboxes",
        sa.Column("sandbox_id", sa.String(32), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("template", sa.Text, nullable=False),
        sa.Column("metadata", sa.Text, nullable=False),
        sa.Column("env_vars", sa.Text, nullable=False),
        sa.Column("token_id", sa.String(64), nullable=True),
        sa.Column("started_at", sa.Float(precision=53), nullable=False),
        sa.Column("end_at", sa.Float(precision=53), nullable=False),
        sa.Column("session_created", sa.Float(precision=53), nullable=True),
        sa.Column("paused_left", sa.Float(precision=53), nullable=True),
    )
    op.create_index("ix_e2b_sandboxes_tenant_id", "e2b_sandboxes", ["tenant_id"])
    op.create_index("ix_e2b_sandboxes_end_at", "e2b_sandboxes", ["end_at"])


def downgrade() -> None:
    op.drop_table("e2b_sandboxes")
