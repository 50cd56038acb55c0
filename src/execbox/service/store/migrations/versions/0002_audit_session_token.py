"""audit: code_hash wide enough for "sha256:<hex>", session_id and token_id columns

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("audit") as batch:
        batch.alter_column("code_hash", type_=sa.String(80), existing_type=sa.String(64), existing_nullable=True)
        batch.add_column(sa.Column("session_id", sa.String(128), nullable=True))
        batch.add_column(sa.Column("token_id", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("audit") as batch:
        batch.drop_column("token_id")
        batch.drop_column("session_id")
        batch.alter_column("code_hash", type_=sa.String(64), existing_type=sa.String(80), existing_nullable=True)
