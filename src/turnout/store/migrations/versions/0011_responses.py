"""Stored answers of the OpenAI Responses API (``store``, ``previous_response_id``): each response with the input
items it answered, the app whose key asked for it, and when it expires.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.String(160), primary_key=True),
        sa.Column("app", sa.String(128), nullable=True),
        sa.Column("model", sa.String(600), nullable=False),
        sa.Column("previous_response_id", sa.String(160), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("input_items", sa.JSON, nullable=False),
        sa.Column("response", sa.JSON, nullable=False),
    )
    op.create_index("ix_responses_expires_at", "responses", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_responses_expires_at", "responses")
    op.drop_table("responses")
