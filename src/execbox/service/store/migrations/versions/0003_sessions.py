"""sessions registry and replicas: sessions survive restarts and are shared by replicas

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_TIME = sa.Float(precision=53)


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("provider", sa.String(64), nullable=True),
        sa.Column("box_handle", sa.Text, nullable=False, server_default="{}"),
        sa.Column("runtime", sa.String(32), nullable=True),
        sa.Column("network_policy", sa.Text, nullable=False, server_default="{}"),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(128), nullable=True),
        sa.Column("lease_expires", _TIME, nullable=True),
        sa.Column("contexts_lost", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", _TIME, nullable=False),
        sa.Column("last_used", _TIME, nullable=False),
        sa.Column("expires_at", _TIME, nullable=True),
        sa.UniqueConstraint("tenant_id", "session_id", name="uq_sessions_tenant_session"),
    )
    op.create_index("ix_sessions_state", "sessions", ["state"])
    op.create_index("ix_sessions_owner", "sessions", ["owner"])
    op.create_table(
        "replicas",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("url", sa.Text, nullable=True),
        sa.Column("started_at", _TIME, nullable=False),
        sa.Column("heartbeat", _TIME, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("replicas")
    op.drop_index("ix_sessions_owner", "sessions")
    op.drop_index("ix_sessions_state", "sessions")
    op.drop_table("sessions")
