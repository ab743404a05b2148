"""Store tests, each run on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import inspect

from turnout.core.patterns import PatternError
from turnout.store.audit import AuditLog
from turnout.store.db import Database, StoreError, database_url
from turnout.store.keys import KeyRevoked, KeyStore, hash_key, parse_scopes

NOW = 1_800_000_000.0


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    database.migrate()
    yield database
    database.close()


def test_migrate_is_idempotent_and_creates_tables(db: Database) -> None:
    db.migrate()
    names = set(inspect(db.engine).get_table_names())
    assert {"tenants", "apps", "keys", "usage_rollup", "endpoints", "audit", "alembic_version"} <= names


def test_create_find_and_plaintext_never_stored(db: Database) -> None:
    store = KeyStore(db)
    record, plaintext = store.create(
        app="chat-ui", tenant="team-a", scopes=["qwen3:*"], rpm=60, daily_tokens=10_000, expires_at=None, now=NOW
    )
    assert plaintext.startswith("tk_") and len(plaintext) > 40
    assert record.prefix == plaintext[:10] and record.app == "chat-ui" and record.tenant == "team-a"
    found = store.find(plaintext)
    assert found == record and found.allows("qwen3:8b") and not found.allows("llama3")
    assert store.find(plaintext + "x") is None
    with db.engine.connect() as conn:
        dump = "\n".join(
            str(row) for table in ("keys", "apps", "tenants") for row in conn.exec_driver_sql(f"SELECT * FROM {table}")
        )
    assert plaintext not in dump and hash_key(plaintext) in dump


def test_app_keeps_its_tenant(db: Database) -> None:
    store = KeyStore(db)
    store.create(app="a", tenant="t1", scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=NOW)
    second, _ = store.create(app="a", tenant=None, scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=NOW)
    assert second.tenant == "t1"
    with pytest.raises(StoreError, match='belongs to tenant "t1"'):
        store.create(app="a", tenant="t2", scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=NOW)
    assert store.count() == 2  # nothing half-written by the refused call


def test_revoke_and_expiry(db: Database) -> None:
    store = KeyStore(db)
    rec, _ = store.create(
        app="a", tenant=None, scopes=["*"], rpm=None, daily_tokens=None, expires_at=NOW + 100, now=NOW
    )
    assert rec.usable(NOW) is None and rec.usable(NOW + 100) == "this API key has expired"
    before, after = store.revoke(rec.prefix, now=NOW + 1)
    assert before.revoked_at is None and after.usable(NOW + 1) == "this API key was revoked"
    with pytest.raises(KeyRevoked, match="already revoked"):  # nothing written: the first revocation stands
        store.revoke(str(rec.id), now=NOW + 5)
    assert store.get(str(rec.id)).revoked_at == NOW + 1


def test_rotate_keeps_old_key_for_grace(db: Database) -> None:
    store = KeyStore(db)
    rec, old_plain = store.create(
        app="a", tenant=None, scopes=["m:*"], rpm=5, daily_tokens=None, expires_at=None, now=NOW
    )
    old, new, new_plain = store.rotate(rec.prefix, grace_s=60, now=NOW + 10)
    assert new_plain != old_plain and new.scopes == rec.scopes and new.rpm == 5
    assert old.expires_at == NOW + 70 and old.usable(NOW + 69) is None and old.usable(NOW + 70)
    assert new.lineage == old.lineage == rec.id  # limits are shared along a rotation chain
    assert store.find(old_plain) is not None and store.find(new_plain) == new


@pytest.mark.parametrize("ref", ["nope", "999", "tk_doesnotexist"])
def test_unknown_key_ref(db: Database, ref: str) -> None:
    with pytest.raises(KeyError, match="no key"):
        KeyStore(db).revoke(ref, now=NOW)


def test_invalid_limits_write_nothing(db: Database) -> None:
    with pytest.raises(StoreError, match="rpm must be at least 1"):
        KeyStore(db).create(app="a", tenant=None, scopes=["*"], rpm=0, daily_tokens=None, expires_at=None, now=NOW)
    assert KeyStore(db).count() == 0


def test_audit_is_append_only_and_filterable(db: Database) -> None:
    log = AuditLog(db)
    log.record(actor="admin", action="key.create", target="key:1", after={"app": "a"}, now=NOW)
    log.record(
        actor="admin", action="placement.toggle", target="worker:n1", before={"x": 1}, after={"x": 2}, now=NOW + 1
    )
    entries = log.entries()
    assert [e.action for e in entries] == ["placement.toggle", "key.create"]
    assert entries[0].before == {"x": 1} and entries[0].after == {"x": 2}
    assert [e.action for e in log.entries(action="key.create")] == ["key.create"]
    assert [e.action for e in log.entries(since=NOW + 0.5)] == ["placement.toggle"]


@pytest.mark.parametrize(
    ("items", "expected"),
    [(None, ["*"]), ([], ["*"]), (["model:qwen3:*", "llama3.2"], ["qwen3:*", "llama3.2"])],
)
def test_parse_scopes(items: list[str] | None, expected: list[str]) -> None:
    assert parse_scopes(items) == expected


def test_parse_scopes_rejects_bad_pattern() -> None:
    with pytest.raises(PatternError):
        parse_scopes(["model:q*x"])


def test_database_url_defaults_and_aliases(tmp_path: object) -> None:
    from pathlib import Path

    assert database_url(None, Path("/d")) == "sqlite:////d/turnout.db"
    assert database_url("postgresql://u@h/db", Path("/d")) == "postgresql+psycopg://u@h/db"
    assert database_url("postgres://u@h/db", Path("/d")) == "postgresql+psycopg://u@h/db"
    assert Database("postgresql+psycopg://u:secret@h/db").safe_url == "postgresql+psycopg://u:***@h/db"


def test_usage_rollups_summarise(db: Database) -> None:
    from turnout.store.usage import UsageRow, UsageStore

    store = UsageStore(db)
    rows = [
        UsageRow(NOW + i, None, "openai:chat", "m", "w1", 200, False, 5, 3, float(ms))
        for i, ms in enumerate([10, 12, 14, 16, 900])
    ]
    rows.append(UsageRow(NOW + 3700, None, "openai:chat", "m", "w1", 502, True, 0, 0, 5.0))
    store.insert_many(rows[:3])
    store.insert_many(rows[3:])  # two flushes of the same minute add up
    hours = store.summary(since=NOW - 60)
    first = next(h for h in hours if h["bucket_start"] <= NOW < h["bucket_start"] + 3600)
    assert first["requests"] == 5 and first["prompt_tokens"] == 25 and first["completion_tokens"] == 15
    assert 10 <= first["latency_ms_p50"] <= 25 and 500 < first["latency_ms_p95"] <= 1000
    assert first["latency_ms_max"] == 900
    [day] = store.summary(since=NOW - 60, bucket="day")  # the 502 an hour later is the same day
    assert day["requests"] == 6 and day["errors"] == 1
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM usage_rollup").scalar() == 3  # not one per request


def test_a_connection_held_while_the_store_closes_is_closed_when_given_back(database_url: str) -> None:
    """SQLAlchemy's dispose closes the idle connections only: one a thread still held (work that outlived the task
    awaiting it) went back into a pool nothing referred to, and psycopg warned of it when the collector found it
    open (CI: ``BaseConnection.__del__``, an unraisable error in a test that happened to be running)."""
    database = Database.migrated(database_url)
    held = database.engine.connect()
    raw = held.connection.dbapi_connection
    assert raw is not None
    database.close()
    held.close()  # given back after the close
    if database.dialect == "sqlite":
        with pytest.raises(Exception, match="closed"):
            raw.execute("SELECT 1")
    else:
        assert raw.closed
    with database.begin() as conn:  # still usable: a new connection
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    database.close()


def test_a_store_that_cannot_be_migrated_is_closed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[Database] = []
    close = Database.close
    monkeypatch.setattr(Database, "close", lambda self: (closed.append(self), close(self)))
    path = tmp_path / "turnout.db"
    path.write_bytes(b"not a database file at all, " * 200)
    with pytest.raises(StoreError, match="cannot migrate"):
        Database.migrated(f"sqlite:///{path}")
    assert len(closed) == 1 and closed[0].closed
