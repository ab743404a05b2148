"""Usage as per-minute roll-ups instead of one row per request (a busy gateway wrote millions a day).

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    op.create_table(
        "usage_rollup",
        sa.Column("id", _ID, primary_key=True),
        sa.Column("minute", sa.Integer, nullable=False),
        sa.Column("key_id", sa.Integer, nullable=True),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("worker", sa.String(128), nullable=True),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("fallback_from", sa.String(320), nullable=True),
        sa.Column("requests", sa.Integer, nullable=False),
        sa.Column("errors", sa.Integer, nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
        sa.Column("latency_ms_sum", sa.Float, nullable=False),
        sa.Column("latency_ms_max", sa.Float, nullable=False),
        sa.Column("latency_buckets", sa.JSON, nullable=False),
    )
    op.create_index("ix_usage_rollup_minute", "usage_rollup", ["minute"])
    op.create_index("ix_usage_rollup_key_minute", "usage_rollup", ["key_id", "minute"])
    # Carry existing per-request rows over as one-request roll-ups. Their latency keeps its sum and max, but
    # no histogram (bucketing is not portable SQL), so they do not count towards p50/p95.
    op.execute(
        "INSERT INTO usage_rollup (minute, key_id, endpoint, model, worker, status, fallback_from, requests, errors,"
        " prompt_tokens, completion_tokens, latency_ms_sum, latency_ms_max, latency_buckets)"
        " SELECT CAST(ts AS INTEGER) / 60 * 60, key_id, endpoint, model, worker, status, fallback_from, 1,"
        " CASE WHEN error THEN 1 ELSE 0 END, prompt_tokens, completion_tokens, latency_ms, latency_ms, '[]' FROM usage"
    )
    op.drop_table("usage")


def downgrade() -> None:
    raise NotImplementedError("usage roll-ups cannot be split back into per-request rows")
