"""When each model was first listed: a stable ``modified_at`` across the processes of a gateway and restarts.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_listings",
        sa.Column("name", sa.String(600), primary_key=True),
        sa.Column("first_listed", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("model_listings")
