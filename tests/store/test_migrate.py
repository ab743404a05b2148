"""`Database.migrate`: Alembic only when the store is behind the migration files (on SQLite and PostgreSQL)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import inspect, text

from turnout.state.store_export import head_revision
from turnout.store.db import Database, migration_head

MIGRATIONS = Path(__file__).parents[2] / "src" / "turnout" / "store" / "migrations"


def _revision(db: Database) -> list[str]:
    with db.engine.connect() as conn:
        return list(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())


def _upgrade_to(db: Database, revision: str) -> None:
    """The store as a gateway of ``revision`` left it (the migration files up to there)."""
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def test_the_files_head_is_alembics_head() -> None:
    assert migration_head() == head_revision()


def test_a_store_behind_the_files_is_still_migrated(database_url: str) -> None:
    db = Database(database_url)
    try:
        _upgrade_to(db, "0004")
        assert "admin_sessions" not in inspect(db.engine).get_table_names()
        db.migrate()
        assert _revision(db) == [head_revision()]
        assert "admin_sessions" in inspect(db.engine).get_table_names()
    finally:
        db.close()


def test_an_up_to_date_store_does_not_import_alembic(tmp_path: Path) -> None:
    import subprocess

    url = f"sqlite:///{tmp_path / 'turnout.db'}"
    first = Database(url)
    first.migrate()
    first.close()
    check = (
        "import sys\nfrom turnout.store.db import Database\n"
        f"db = Database({url!r})\ndb.migrate()\ndb.close()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))"
    )
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("files", "head"),
    [
        ({"0001_a.py": 'revision = "0001"\ndown_revision = None\n'}, "0001"),
        (
            {
                "0001_a.py": 'revision = "0001"\ndown_revision = None\n',
                "0002_b.py": 'revision: str = "0002"\ndown_revision: str | None = "0001"\n',
            },
            "0002",
        ),
        (  # two heads: let Alembic decide (and complain)
            {
                "0001_a.py": 'revision = "0001"\ndown_revision = None\n',
                "0002_b.py": 'revision = "0002"\ndown_revision = "0001"\n',
                "0003_c.py": 'revision = "0003"\ndown_revision = "0001"\n',
            },
            None,
        ),
        (  # a merge revision names a tuple: not read here
            {
                "0001_a.py": 'revision = "0001"\ndown_revision = None\n',
                "0002_b.py": 'revision = "0002"\ndown_revision = ("0001", "0003")\n',
            },
            None,
        ),
        ({"0001_a.py": "REVISION = '0001'\n"}, None),  # not declared the usual way
        ({}, None),
    ],
)
def test_migration_head_is_read_only_when_certain(tmp_path: Path, files: dict[str, str], head: str | None) -> None:
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    (tmp_path / "__init__.py").write_text("")
    assert migration_head(tmp_path) == head


def test_replicas_migrating_a_new_postgresql_at_once_all_succeed(postgres_database: str) -> None:
    """Three gateways started together on a new database (a Deployment's first rollout): without the migration's
    advisory lock two of them fail with duplicate tables."""
    import subprocess

    check = f"from turnout.store.db import Database\ndb = Database({postgres_database!r})\ndb.migrate()\ndb.close()\n"
    procs = [
        subprocess.Popen([sys.executable, "-c", check], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in results]
    db = Database(postgres_database)
    try:
        assert _revision(db) == [head_revision()]
    finally:
        db.close()


def test_the_shared_state_starts_with_the_change_version_at_zero(database_url: str) -> None:
    db = Database(database_url)
    try:
        db.migrate()
        with db.engine.connect() as conn:
            rows = conn.execute(text("SELECT name, version, document FROM shared_state")).all()
        assert [tuple(r) for r in rows] == [("changes", 0, None)]
    finally:
        db.close()


def test_batches_ended_before_0017_count_their_unanswered_lines(database_url: str) -> None:
    """A cancelled batch from before migration 0017: its lines given batch_cancelled at its end (no response) are
    counted as unanswered; a line that failed with an answer (a 400) is not; a completed batch counts none."""
    db = Database(database_url)
    try:
        _upgrade_to(db, "0016")
        never = b'{"id":"l1","custom_id":"a","response":null,"error":{"code":"batch_cancelled","message":"..."}}'
        answered = b'{"id":"l2","custom_id":"b","response":{"status_code":400,"body":{}},"error":null}'
        with db.engine.begin() as conn:
            for batch_id, status in (("batch_c", "cancelled"), ("batch_d", "completed")):
                conn.execute(
                    text(
                        "INSERT INTO batches (id, endpoint, input_file_id, completion_window, status, created_at, "
                        "expires_at, total, completed, failed, prompt_tokens, completion_tokens) VALUES (:id, "
                        "'/v1/chat/completions', 'file-x', '24h', :status, 0, 1, 4, 1, 3, 0, 0)"
                    ),
                    {"id": batch_id, "status": status},
                )
            rows = [("batch_c", 1, never), ("batch_c", 2, never), ("batch_c", 3, answered), ("batch_d", 1, answered)]
            for batch_id, line, output in rows:
                conn.execute(
                    text(
                        "INSERT INTO batch_results (batch_id, line, ok, output, prompt_tokens, completion_tokens, "
                        "recorded_at) VALUES (:b, :l, :ok, :o, 0, 0, 0)"
                    ),
                    {"b": batch_id, "l": line, "ok": False, "o": output},
                )
        db.migrate()
        with db.engine.connect() as conn:
            counts = dict(conn.execute(text("SELECT id, unanswered FROM batches")).all())
        assert counts == {"batch_c": 2, "batch_d": 0}
    finally:
        db.close()
