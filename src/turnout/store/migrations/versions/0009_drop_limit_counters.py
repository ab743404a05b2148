"""The limit counters of `turnout serve --workers N` leave the store: its supervisor keeps them now.

The processes of one gateway asked the store for every admission of a limited key (one transaction each);
they ask their supervisor instead (turnout.gateway.shared_limits). The tables held a minute's rate window and
today's token budgets: like a restart's, the upgrade starts them over.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_limit_admissions_subject_at", "limit_admissions")
    op.drop_table("limit_admissions")
    op.drop_table("limit_budgets")


def downgrade() -> None:  # as 0006 and 0007 left them, empty
    op.create_table(
        "limit_budgets",
        sa.Column("subject", sa.String(160), primary_key=True),
        sa.Column("day", sa.Integer, nullable=False),
        sa.Column("used", sa.BigInteger, nullable=False),
        sa.Column("in_window", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_table(
        "limit_admissions",
        sa.Column("member", sa.String(32), primary_key=True),
        sa.Column("subject", sa.String(160), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )
    op.create_index("ix_limit_admissions_subject_at", "limit_admissions", ["subject", "at"])
