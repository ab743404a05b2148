"""Batches: how many of a batch's failed lines got no answer (``batch_cancelled``, ``batch_expired``), so that the
progress of a cancelled or expired batch counts the lines answered, not the lines given an error line at its end.

The batches that ended cancelled or expired before this migration are counted from their error lines: a line with
no ``response`` and one of those two codes (what ``turnout.core.batches.failed_line`` writes), each parsed as JSON.

Revision ID: 0017
Revises: 0016
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_NEVER = ("batch_cancelled", "batch_expired")


def _unanswered(output: bytes) -> bool:
    try:
        line = json.loads(output)
    except (ValueError, UnicodeDecodeError):
        return False
    error = line.get("error") if isinstance(line, dict) else None
    return line.get("response") is None and isinstance(error, dict) and error.get("code") in _NEVER


def upgrade() -> None:
    op.add_column("batches", sa.Column("unanswered", sa.Integer(), nullable=False, server_default="0"))
    conn = op.get_bind()
    ended = conn.execute(sa.text("SELECT id FROM batches WHERE status IN ('cancelled', 'expired')")).scalars().all()
    for batch_id in ended:
        outputs = conn.execute(
            sa.text("SELECT output FROM batch_results WHERE batch_id = :id AND ok = :ok"),
            {"id": batch_id, "ok": False},
        ).scalars()
        count = sum(_unanswered(bytes(output)) for output in outputs)
        if count:
            conn.execute(sa.text("UPDATE batches SET unanswered = :n WHERE id = :id"), {"n": count, "id": batch_id})


def downgrade() -> None:
    # a plain DROP COLUMN (SQLite has it since 3.35), as 0016's
    op.drop_column("batches", "unanswered")
