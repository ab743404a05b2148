"""What every gateway replica must see the same: the placement override document and the admin change version.

``shared_state`` holds one row per shared thing, by name (:mod:`turnout.store.shared_state`):

- ``changes``: ``version`` goes up by one with every admin change any replica (or process, or restore) makes;
  each gateway polls it (and hears of it through Redis when configured) and re-reads what it keeps in memory.
- ``placement``: ``document`` is the placement override file's content (``model-placement.json``, the design's
  format), ``version`` its own count of writes. No row: the store has never held the overrides (a gateway
  brings its file in at its first start on the store).

The ``changes`` row is created here, at 0, so that every later bump is a plain ``UPDATE``.

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "shared_state",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("document", sa.Text, nullable=True),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.bulk_insert(table, [{"name": "changes", "version": 0, "document": None, "updated_at": 0.0}])


def downgrade() -> None:
    op.drop_table("shared_state")
