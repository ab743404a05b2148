"""Browser sessions of the admin UI, in the store so that any gateway replica can serve them.

Only a SHA-256 of the session cookie is kept (a copy of the database signs nobody in); ``csrf`` is the
session's CSRF token, sent back by the browser on every state change.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "admin_sessions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
        sa.Column("remote", sa.String(64), nullable=True),
    )
    op.create_index("ix_admin_sessions_last_seen", "admin_sessions", ["last_seen"])


def downgrade() -> None:
    op.drop_index("ix_admin_sessions_last_seen", "admin_sessions")
    op.drop_table("admin_sessions")
