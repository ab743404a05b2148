"""Usage roll-ups keep their latency minimum (percentiles stay within [min, max]) and a 64-bit minute.

New rows store their latency histogram sparsely over the finer ``turnout.core.latency.BOUNDS_MS``
(``{"<bucket>": count}``); existing rows keep their dense lists over ``LEGACY_BOUNDS_MS``, which the summary
still reads. ``minute`` becomes BIGINT on PostgreSQL (epoch seconds leave int32 in 2038); SQLite's INTEGER is
64-bit already.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("usage_rollup", sa.Column("latency_ms_min", sa.Float, nullable=True))
    if op.get_bind().dialect.name != "sqlite":
        op.alter_column("usage_rollup", "minute", type_=sa.BigInteger, existing_nullable=False)


def downgrade() -> None:
    raise NotImplementedError("sparse latency histograms cannot be turned back into the coarse lists in SQL")
