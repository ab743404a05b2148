"""Table definitions (the Alembic migrations create exactly these)."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
)

__all__ = [
    "admin_sessions",
    "apps",
    "audit",
    "batch_files",
    "batch_results",
    "batches",
    "endpoints",
    "keys",
    "metadata",
    "model_aliases",
    "model_listings",
    "people",
    "personal_tokens",
    "responses",
    "shared_state",
    "tenants",
    "usage",
]

metadata = MetaData()

tenants = Table(
    "tenants",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(128), nullable=False, unique=True),
    Column("max_concurrent", Integer, nullable=True),
    Column("weight", Integer, nullable=False, server_default="1"),
    Column("created_at", Float, nullable=False),
    # since 0016: the default priority class of the tenant's keys (NULL: config.json's, else standard)
    Column("priority", String(16), nullable=True),
)

apps = Table(
    "apps",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("tenant_id", Integer, ForeignKey("tenants.id"), nullable=False),
    Column("name", String(128), nullable=False, unique=True),
    Column("created_at", Float, nullable=False),
)

keys = Table(
    "keys",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("app_id", Integer, ForeignKey("apps.id"), nullable=False),
    Column("prefix", String(16), nullable=False),
    Column("hash", String(64), nullable=False, unique=True),
    Column("models", JSON, nullable=False),
    Column("rpm", Integer, nullable=True),
    Column("daily_tokens", BigInteger, nullable=True),
    Column("expires_at", Float, nullable=True),
    Column("revoked_at", Float, nullable=True),
    Column("rotated_to", Integer, nullable=True),
    Column("lineage", Integer, nullable=True),  # the first key of a rotation chain; limits are shared along it
    Column("created_at", Float, nullable=False),
    Column("priority", String(16), nullable=True),  # since 0016: the key's priority class (NULL: its tenant's)
)

usage = Table(
    # One row per (flush, minute, key, endpoint, model, worker, status, fallback origin, alias): requests are
    # rolled up in memory and written in batches, so the table grows with traffic shape, not volume.
    "usage_rollup",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("minute", BigInteger, nullable=False),  # epoch seconds // 60 * 60 (BigInteger since 0004: past 2038)
    Column("key_id", Integer, nullable=True),
    Column("endpoint", String(64), nullable=False),
    Column("model", String(256), nullable=False),
    Column("worker", String(128), nullable=True),
    Column("status", Integer, nullable=False),
    Column("fallback_from", String(320), nullable=True),
    Column("alias", String(256), nullable=True),  # since 0013: the alias the request named (model: what ran)
    Column("batch_id", String(64), nullable=True),  # since 0014: the batch whose line this request was
    Column("requests", Integer, nullable=False),
    Column("errors", Integer, nullable=False),
    Column("prompt_tokens", BigInteger, nullable=False),
    Column("completion_tokens", BigInteger, nullable=False),
    Column("latency_ms_sum", Float, nullable=False),
    Column("latency_ms_min", Float, nullable=True),  # since 0004; NULL in older rows
    Column("latency_ms_max", Float, nullable=False),
    # {"<bucket index>": count} over turnout.core.latency.BOUNDS_MS; rows written before 0004 hold a dense
    # list over LEGACY_BOUNDS_MS instead (and [] for rows carried over from before roll-ups)
    Column("latency_buckets", JSON, nullable=False),
    Index("ix_usage_rollup_minute", "minute"),
    Index("ix_usage_rollup_key_minute", "key_id", "minute"),
)

endpoints = Table(
    "endpoints",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("url", String(2048), nullable=False),
    Column("api", String(16), nullable=False),
    Column("credential", Text, nullable=True),  # Fernet token, never the plaintext
    Column("fallback_model", String(256), nullable=True),
    Column("latency_budget_ms", Integer, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("native_apis", String(64), nullable=True),  # "anthropic,responses": client APIs it serves itself
)

audit = Table(
    "audit",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("ts", Float, nullable=False),
    Column("actor", String(128), nullable=False),
    Column("action", String(64), nullable=False),
    Column("target", String(256), nullable=False),
    Column("before", JSON, nullable=True),
    Column("after", JSON, nullable=True),
    Column("detail", Text, nullable=True),
    Index("ix_audit_ts", "ts"),
)

admin_sessions = Table(
    # Browser sessions of the admin UI (turnout.admin.ui.sessions): the cookie's SHA-256, never the cookie.
    "admin_sessions",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("csrf", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("last_seen", Float, nullable=False),
    Column("remote", String(64), nullable=True),
    # Who signed in (since 0012): the audit actor ("token" for the admin token, "oidc:<sub>" for a person), the
    # person's row, their role and team tenants as at sign-in, and what the header shows. NULL actor: a session
    # from before 0012, signed in with the admin token.
    Column("actor", String(128), nullable=True),
    Column("person_id", Integer, nullable=True),
    Column("role", String(32), nullable=True),
    Column("teams", JSON, nullable=True),
    Column("label", String(320), nullable=True),
    Index("ix_admin_sessions_last_seen", "last_seen"),
    Index("ix_admin_sessions_person", "person_id"),
)

people = Table(
    # People who signed in with single sign-on (turnout.store.people): their provider subject, what the
    # provider said of them at their last sign-in, and whether an admin disabled them.
    "people",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("subject", String(255), nullable=False, unique=True),  # the ID token's "sub"
    Column("email", String(320), nullable=True),
    Column("name", String(256), nullable=True),
    Column("role", String(32), nullable=True),  # viewer | operator | admin | NULL (no ladder role)
    Column("teams", JSON, nullable=False),  # tenants they are the team-admin of
    Column("created_at", Float, nullable=False),
    Column("last_signin", Float, nullable=True),
    Column("disabled_at", Float, nullable=True),
)

personal_tokens = Table(
    # Personal admin tokens for the CLI and scripts: the SHA-256 of the token, never the token.
    "personal_tokens",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("person_id", Integer, ForeignKey("people.id"), nullable=False),
    Column("name", String(128), nullable=False),
    Column("prefix", String(16), nullable=False),  # tpat_ + 7: what lists show
    Column("hash", String(64), nullable=False, unique=True),
    Column("role", String(32), nullable=True),
    Column("teams", JSON, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("revoked_at", Float, nullable=True),
    Index("ix_personal_tokens_person", "person_id"),
)

model_listings = Table(
    # When the gateway first listed a model that reports no time of its own (an OpenAI-style server without
    # ``created``): its stable ``modified_at``, the same in every process and after a restart.
    "model_listings",
    metadata,
    Column("name", String(600), primary_key=True),  # the shared name ("<endpoint>/<model>" for an endpoint's)
    Column("first_listed", Float, nullable=False),  # epoch seconds
)

model_aliases = Table(
    # Model aliases set through the admin API or the CLI (turnout.store.aliases); the config's own are not here.
    "model_aliases",
    metadata,
    Column("canonical", String(264), primary_key=True),  # turnout.core.names.canonical(name): one row per alias
    Column("name", String(256), nullable=False),  # as written
    Column("model", String(256), nullable=False),  # the model it stands for (a shared name)
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

responses = Table(
    # Stored answers of the OpenAI Responses API (turnout.store.responses): the response, the input items it
    # answered (the whole conversation, so a continuation needs one read), the app whose key asked for it.
    "responses",
    metadata,
    Column("id", String(160), primary_key=True),
    Column("app", String(128), nullable=True),  # NULL: asked without a key (open access)
    Column("model", String(600), nullable=False),
    Column("previous_response_id", String(160), nullable=True),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("input_items", JSON, nullable=False),
    Column("response", JSON, nullable=False),
    Index("ix_responses_expires_at", "expires_at"),
)

batch_files = Table(
    # Files of the OpenAI Batch API (turnout.store.batches): an uploaded input file with its content, or a batch's
    # output or error file, whose lines are that batch's rows in batch_results (made when the file is read).
    "batch_files",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("app", String(128), nullable=True),  # NULL: uploaded without a key (open access)
    Column("purpose", String(32), nullable=False),  # batch | batch_output | batch_error
    Column("filename", String(512), nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("lines", Integer, nullable=False),  # requests of an input file; lines of an output or error file
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=True),
    Column("batch_id", String(64), nullable=True),  # an output or error file: the batch that wrote it
    Column("content", LargeBinary, nullable=True),  # an input file as uploaded; NULL for output and error files
    Index("ix_batch_files_app_created", "app", "created_at"),
    Index("ix_batch_files_expires_at", "expires_at"),
)

batches = Table(
    # Batches of the OpenAI Batch API: OpenAI's batch object, the key it runs as, and its runner's lease.
    "batches",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("app", String(128), nullable=True),
    Column("key_id", Integer, nullable=True),  # the key that created it: its lines run as that key (its lineage's)
    Column("endpoint", String(64), nullable=False),
    Column("input_file_id", String(64), nullable=False),
    Column("completion_window", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("in_progress_at", Float, nullable=True),
    Column("finalizing_at", Float, nullable=True),
    Column("completed_at", Float, nullable=True),
    Column("failed_at", Float, nullable=True),
    Column("expired_at", Float, nullable=True),
    Column("cancelling_at", Float, nullable=True),
    Column("cancelled_at", Float, nullable=True),
    Column("ended_at", Float, nullable=True),  # when it reached completed, failed, expired or cancelled
    Column("total", Integer, nullable=False),
    Column("completed", Integer, nullable=False),
    Column("failed", Integer, nullable=False),
    Column("unanswered", Integer, nullable=False, server_default="0"),  # of failed: never answered (cancelled, expired)
    Column("prompt_tokens", BigInteger, nullable=False),
    Column("completion_tokens", BigInteger, nullable=False),
    Column("output_file_id", String(64), nullable=True),
    Column("error_file_id", String(64), nullable=True),
    Column("errors", JSON, nullable=True),  # OpenAI's errors.data of a failed batch
    Column("metadata", JSON, nullable=True),
    Column("output_expires_s", Float, nullable=True),  # output_expires_after.seconds
    Column("model", String(256), nullable=True),  # the model every line names; null: several, or made before 0018
    Column("runner", String(160), nullable=True),  # who runs it now (host:pid:random), with its lease
    Column("lease_until", Float, nullable=True),
    Index("ix_batches_app_created", "app", "created_at"),
    Index("ix_batches_status", "status"),
    Index("ix_batches_ended_at", "ended_at"),
)

batch_results = Table(
    # One row per answered line of a batch, written before the line counts as done; the primary key makes a line's
    # answer unique however many runners sent it (turnout.gateway.batch_runner says what "exactly once" means).
    "batch_results",
    metadata,
    Column("batch_id", String(64), nullable=False),
    Column("line", Integer, nullable=False),  # the input file's line number
    Column("ok", Boolean, nullable=False),  # a 2xx answer: the output file's; else the error file's
    Column("output", LargeBinary, nullable=False),  # the output or error file's JSON line (UTF-8)
    Column("prompt_tokens", Integer, nullable=False),
    Column("completion_tokens", Integer, nullable=False),
    Column("recorded_at", Float, nullable=False),
    PrimaryKeyConstraint("batch_id", "line", name="pk_batch_results"),
)

shared_state = Table(
    # What every replica must see the same (turnout.store.shared_state): "changes" (the admin change version)
    # and "placement" (the override file's document and its own write count).
    "shared_state",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("version", BigInteger, nullable=False),
    Column("document", Text, nullable=True),
    Column("updated_at", Float, nullable=False),
)
