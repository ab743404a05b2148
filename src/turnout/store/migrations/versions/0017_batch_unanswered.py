"""Batches: how many of a batch's failed lines got no answer (``batch_cancelled``, ``batch_expired``), so that the
progress of a cancelled or expired batch counts the lines answered, not the lines given an error line at its end.
Batches ended before this migration count 0 (those lines stay counted as answered).

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("unanswered", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    # a plain DROP COLUMN (SQLite has it since 3.35), as 0016's
    op.drop_column("batches", "unanswered")
