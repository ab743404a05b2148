"""Priority classes: a key's class and its tenant's default class (``interactive``, ``standard`` or ``batch``;
NULL: not set here, see turnout.core.priority).

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("keys", sa.Column("priority", sa.String(16), nullable=True))
    op.add_column("tenants", sa.Column("priority", sa.String(16), nullable=True))


def downgrade() -> None:
    # a plain DROP COLUMN (SQLite has it since 3.35): a batch operation would copy the tenants table, and
    # dropping the old copy fails on SQLite while apps' foreign key points at it
    op.drop_column("tenants", "priority")
    op.drop_column("keys", "priority")
