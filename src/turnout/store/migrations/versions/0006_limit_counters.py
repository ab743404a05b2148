"""Limit counters for the processes of `turnout serve --workers N`.

A per-subject budget row (locked by each admission) and the admissions of the last minute.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "limit_budgets",
        sa.Column("subject", sa.String(160), primary_key=True),
        sa.Column("day", sa.Integer, nullable=False),
        sa.Column("used", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "limit_admissions",
        sa.Column("member", sa.String(32), primary_key=True),
        sa.Column("subject", sa.String(160), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )
    op.create_index("ix_limit_admissions_subject_at", "limit_admissions", ["subject", "at"])


def downgrade() -> None:
    op.drop_index("ix_limit_admissions_subject_at", "limit_admissions")
    op.drop_table("limit_admissions")
    op.drop_table("limit_budgets")
