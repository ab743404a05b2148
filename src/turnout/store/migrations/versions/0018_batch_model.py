"""Batches: the model their lines name (OpenAI's Batch object carries ``model``), when they all name the same one.

Batches created before this migration have none (null, as the Batch object gave for every batch before): their
input files may be gone, and reading every one at a migration is not worth a field the SDK takes as optional.

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("model", sa.String(256), nullable=True))


def downgrade() -> None:
    # a plain DROP COLUMN (SQLite has it since 3.35), as 0016's and 0017's
    op.drop_column("batches", "model")
