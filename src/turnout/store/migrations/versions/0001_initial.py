"""Tenants, apps, keys, usage and audit.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("max_concurrent", sa.Integer, nullable=True),
        sa.Column("weight", sa.Integer, nullable=False, server_default="1"),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "apps",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("tenant_id", sa.Integer, sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "keys",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("app_id", sa.Integer, sa.ForeignKey("apps.id"), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False, unique=True),
        sa.Column("models", sa.JSON, nullable=False),
        sa.Column("rpm", sa.Integer, nullable=True),
        sa.Column("daily_tokens", sa.BigInteger, nullable=True),
        sa.Column("expires_at", sa.Float, nullable=True),
        sa.Column("revoked_at", sa.Float, nullable=True),
        sa.Column("rotated_to", sa.Integer, nullable=True),
        sa.Column("lineage", sa.Integer, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "usage",
        sa.Column("id", _ID, primary_key=True),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("key_id", sa.Integer, nullable=True),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("worker", sa.String(128), nullable=True),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("error", sa.Boolean, nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("latency_ms", sa.Float, nullable=False),
    )
    op.create_index("ix_usage_ts", "usage", ["ts"])
    op.create_index("ix_usage_key_ts", "usage", ["key_id", "ts"])
    op.create_table(
        "audit",
        sa.Column("id", _ID, primary_key=True),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(256), nullable=False),
        sa.Column("before", sa.JSON, nullable=True),
        sa.Column("after", sa.JSON, nullable=True),
        sa.Column("detail", sa.Text, nullable=True),
    )
    op.create_index("ix_audit_ts", "audit", ["ts"])


def downgrade() -> None:
    for table in ("audit", "usage", "keys", "apps", "tenants"):
        op.drop_table(table)
