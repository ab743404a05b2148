"""The client APIs an external endpoint serves itself (Anthropic Messages, OpenAI Responses): passed through to
it unchanged instead of translated.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("endpoints") as batch:
        batch.add_column(sa.Column("native_apis", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("endpoints") as batch:
        batch.drop_column("native_apis")
