"""Model aliases set through the admin API or the CLI, and the alias a request asked for in its usage row.

``model_aliases`` holds the runtime aliases (the config's own stay in config.json): one row per name, keyed by
its comparison form (``turnout.core.names.canonical``: ``foo`` and ``foo:latest`` are one alias), so every
replica and every process of `turnout serve --workers N` resolves the same names. ``usage_rollup.alias`` is the
alias a request named (NULL when it named the model itself); ``model`` stays the model that was served.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_aliases",
        sa.Column("canonical", sa.String(264), primary_key=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.add_column("usage_rollup", sa.Column("alias", sa.String(256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_rollup") as batch:
        batch.drop_column("alias")
    op.drop_table("model_aliases")
