"""Limit budgets keep their window's admission count.

Counting the window's rows on every admission cost a scan of up to a minute of admissions; the budget row
(locked by each admission anyway) now carries the count. The window is transient state: it is emptied here
so that the count and the rows agree (at worst one minute's rate window starts over at the upgrade).

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("limit_budgets", sa.Column("in_window", sa.Integer, nullable=False, server_default="0"))
    op.execute("DELETE FROM limit_admissions")


def downgrade() -> None:
    with op.batch_alter_table("limit_budgets") as batch:
        batch.drop_column("in_window")
