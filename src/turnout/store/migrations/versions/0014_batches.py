"""The OpenAI Batch API: its files (an input file's content, output and error files' metadata), its batches with
their runner's lease, each answered line, and the batch a request's usage row belongs to.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "batch_files",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("app", sa.String(128), nullable=True),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(512), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("lines", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=True),
        sa.Column("batch_id", sa.String(64), nullable=True),
        sa.Column("content", sa.LargeBinary, nullable=True),
    )
    op.create_index("ix_batch_files_app_created", "batch_files", ["app", "created_at"])
    op.create_index("ix_batch_files_expires_at", "batch_files", ["expires_at"])
    op.create_table(
        "batches",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("app", sa.String(128), nullable=True),
        sa.Column("key_id", sa.Integer, nullable=True),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("input_file_id", sa.String(64), nullable=False),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("in_progress_at", sa.Float, nullable=True),
        sa.Column("finalizing_at", sa.Float, nullable=True),
        sa.Column("completed_at", sa.Float, nullable=True),
        sa.Column("failed_at", sa.Float, nullable=True),
        sa.Column("expired_at", sa.Float, nullable=True),
        sa.Column("cancelling_at", sa.Float, nullable=True),
        sa.Column("cancelled_at", sa.Float, nullable=True),
        sa.Column("ended_at", sa.Float, nullable=True),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("completed", sa.Integer, nullable=False),
        sa.Column("failed", sa.Integer, nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
        sa.Column("output_file_id", sa.String(64), nullable=True),
        sa.Column("error_file_id", sa.String(64), nullable=True),
        sa.Column("errors", sa.JSON, nullable=True),
        sa.Column("metadata", sa.JSON, nullable=True),
        sa.Column("output_expires_s", sa.Float, nullable=True),
        sa.Column("runner", sa.String(160), nullable=True),
        sa.Column("lease_until", sa.Float, nullable=True),
    )
    op.create_index("ix_batches_app_created", "batches", ["app", "created_at"])
    op.create_index("ix_batches_status", "batches", ["status"])
    op.create_index("ix_batches_ended_at", "batches", ["ended_at"])
    op.create_table(
        "batch_results",
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("line", sa.Integer, nullable=False),
        sa.Column("ok", sa.Boolean, nullable=False),
        sa.Column("output", sa.LargeBinary, nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("recorded_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("batch_id", "line", name="pk_batch_results"),
    )
    op.add_column("usage_rollup", sa.Column("batch_id", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_rollup") as batch:
        batch.drop_column("batch_id")
    op.drop_table("batch_results")
    op.drop_index("ix_batches_ended_at", "batches")
    op.drop_index("ix_batches_status", "batches")
    op.drop_index("ix_batches_app_created", "batches")
    op.drop_table("batches")
    op.drop_index("ix_batch_files_expires_at", "batch_files")
    op.drop_index("ix_batch_files_app_created", "batch_files")
    op.drop_table("batch_files")
