"""External endpoints, and the endpoint a usage row fell back from.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "endpoints",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("api", sa.String(16), nullable=False),
        sa.Column("credential", sa.Text, nullable=True),
        sa.Column("fallback_model", sa.String(256), nullable=True),
        sa.Column("latency_budget_ms", sa.Integer, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    with op.batch_alter_table("usage") as batch:
        batch.add_column(sa.Column("fallback_from", sa.String(320), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("fallback_from")
    op.drop_table("endpoints")
