"""People, personal admin tokens, and who a browser session belongs to (issue 26: single sign-on and roles).

``people`` holds who signed in with OpenID Connect (their provider subject, e-mail, name, role and team tenants
as at their last sign-in, disabled or not); ``personal_tokens`` the SHA-256 of each personal admin token with its
role and expiry; ``admin_sessions`` learns whose session it is. Sessions from before this revision were signed in
with the admin token and keep working as such (actor NULL reads as the admin token).

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "people",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("subject", sa.String(255), nullable=False, unique=True),
        sa.Column("email", sa.String(320), nullable=True),
        sa.Column("name", sa.String(256), nullable=True),
        sa.Column("role", sa.String(32), nullable=True),
        sa.Column("teams", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("last_signin", sa.Float, nullable=True),
        sa.Column("disabled_at", sa.Float, nullable=True),
    )
    op.create_table(
        "personal_tokens",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("person_id", sa.Integer, sa.ForeignKey("people.id"), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False, unique=True),
        sa.Column("role", sa.String(32), nullable=True),
        sa.Column("teams", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float, nullable=True),
    )
    op.create_index("ix_personal_tokens_person", "personal_tokens", ["person_id"])
    with op.batch_alter_table("admin_sessions") as batch:
        batch.add_column(sa.Column("actor", sa.String(128), nullable=True))
        batch.add_column(sa.Column("person_id", sa.Integer, nullable=True))
        batch.add_column(sa.Column("role", sa.String(32), nullable=True))
        batch.add_column(sa.Column("teams", sa.JSON, nullable=True))
        batch.add_column(sa.Column("label", sa.String(320), nullable=True))
    op.create_index("ix_admin_sessions_person", "admin_sessions", ["person_id"])


def downgrade() -> None:
    op.drop_index("ix_admin_sessions_person", "admin_sessions")
    with op.batch_alter_table("admin_sessions") as batch:
        for column in ("label", "teams", "role", "person_id", "actor"):
            batch.drop_column(column)
    op.drop_index("ix_personal_tokens_person", "personal_tokens")
    op.drop_table("personal_tokens")
    op.drop_table("people")
