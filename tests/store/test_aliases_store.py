"""Runtime model aliases in the store, on SQLite and PostgreSQL: one row per name (either spelling), checks run
inside the transaction against what is stored then, guarded writes, the usage rows' alias column, and the
migration both ways."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import inspect, text

from turnout.store.aliases import AliasRecord, AliasStore
from turnout.store.db import Database, StoreError
from turnout.store.keys import StaleRecord
from turnout.store.usage import SUMMARY_COLUMNS, UsageRow, UsageStore, to_csv

MIGRATIONS = Path(__file__).parents[2] / "src" / "turnout" / "store" / "migrations"
NOW = 1_800_000_000.0


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    database.migrate()
    yield database
    database.close()


def test_put_get_all_remove(db: Database) -> None:
    store = AliasStore(db)
    before, after = store.put("claude-sonnet-4-5", "qwen3-coder:30b", now=NOW)
    assert before is None and after == AliasRecord("claude-sonnet-4-5", "qwen3-coder:30b", NOW, NOW)
    assert store.get("claude-sonnet-4-5:latest") == after  # one alias, either spelling
    before, again = store.put("claude-sonnet-4-5:latest", "llama3.2", now=NOW + 5)
    assert before == after and again.name == "claude-sonnet-4-5:latest" and again.created_at == NOW
    assert [r.name for r in store.all()] == ["claude-sonnet-4-5:latest"]  # replaced, not a second row
    store.put("a", "m", now=NOW)
    assert [r.name for r in store.all()] == ["a", "claude-sonnet-4-5:latest"]
    assert store.remove("claude-sonnet-4-5") == again
    assert store.get("claude-sonnet-4-5") is None
    with pytest.raises(KeyError, match='no alias "nope"'):
        store.remove("nope")


def test_an_unchanged_write_still_gets_a_new_stamp(db: Database) -> None:
    """The ETag is made from ``updated_at``: two writes in the same instant must not look alike."""
    store = AliasStore(db)
    _, first = store.put("a", "m", now=NOW)
    _, second = store.put("a", "n", now=NOW)
    assert second.updated_at > first.updated_at


def test_checks_run_in_the_transaction_and_a_refusal_writes_nothing(db: Database) -> None:
    store = AliasStore(db)
    store.put("a", "m", now=NOW)
    seen: list[tuple[AliasRecord | None, list[str]]] = []

    def refuse(before: AliasRecord | None, stored: list[AliasRecord]) -> None:
        seen.append((before, [r.name for r in stored]))
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        store.put("b", "m2", now=NOW, check=refuse)
    with pytest.raises(ValueError, match="no"):
        store.remove("a", check=refuse)
    assert seen == [(None, ["a"]), (AliasRecord("a", "m", NOW, NOW), ["a"])]
    assert [r.name for r in store.all()] == ["a"]


def test_a_row_changed_between_check_and_write_is_stale(db: Database) -> None:
    store = AliasStore(db)
    store.put("a", "m", now=NOW)

    def meanwhile(before: AliasRecord | None, stored: list[AliasRecord]) -> None:
        with db.begin() as conn:  # another writer, committed between this check and this write
            conn.execute(text("UPDATE model_aliases SET updated_at = updated_at + 1"))

    for attempt in (
        lambda: store.put("a", "n", now=NOW + 1, check=meanwhile),
        lambda: store.remove("a", check=meanwhile),
    ):
        with pytest.raises(StoreError) as info:  # StaleRecord (or SQLite's stale snapshot): never a silent overwrite
            attempt()
        assert isinstance(info.value, StaleRecord) or db.dialect == "sqlite", info.value
    assert store.get("a") is not None and store.get("a").model == "m"  # type: ignore[union-attr]

    def inserted(before: AliasRecord | None, stored: list[AliasRecord]) -> None:
        with db.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO model_aliases (canonical, name, model, created_at, updated_at) "
                    "VALUES ('b:latest', 'b', 'x', 1, 1)"
                )
            )

    with pytest.raises(StaleRecord, match="set by someone else"):
        store.put("b", "y", now=NOW, check=inserted)
    assert store.get("b") == AliasRecord("b", "x", 1.0, 1.0)


@pytest.mark.parametrize(("name", "model"), [("", "m"), ("a", ""), ("a\x00", "m"), ("x" * 257, "m")])
def test_names_no_column_should_hold_are_refused(db: Database, name: str, model: str) -> None:
    with pytest.raises(StoreError):
        AliasStore(db).put(name, model, now=NOW)


def test_usage_rows_keep_the_alias(db: Database) -> None:
    usage = UsageStore(db)

    def row(alias: str | None) -> UsageRow:
        return UsageRow(NOW, None, "openai:chat", "qwen3-coder:30b", "gpu", 200, False, 3, 4, 10.0, None, alias)

    result = usage.insert_many([row("claude-sonnet-4-5"), row("claude-sonnet-4-5"), row(None), row("x" * 300)])
    assert result.refused == [] and result.unwritten == {}
    rows = usage.summary(since=0, bucket="day")
    assert sorted((r["alias"] or "", r["requests"]) for r in rows) == [
        ("", 1),
        ("claude-sonnet-4-5", 2),
        ("x" * 256, 1),  # fitted to its column, never refused
    ]
    assert "alias" in SUMMARY_COLUMNS
    header, *lines = to_csv(rows, SUMMARY_COLUMNS).splitlines()
    assert header.split(",")[SUMMARY_COLUMNS.index("alias")] == "alias"
    assert any(",claude-sonnet-4-5," in line for line in lines)


def test_migration_0013_both_ways(database_url: str) -> None:
    db = Database(database_url)
    try:
        db.migrate()
        AliasStore(db).put("a", "m", now=NOW)
        cfg = AlembicConfig()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        with db.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "-1")
        names = inspect(db.engine).get_table_names()
        assert "model_aliases" not in names
        assert "alias" not in {c["name"] for c in inspect(db.engine).get_columns("usage_rollup")}
        db.migrate()
        assert AliasStore(db).all() == []
        assert "alias" in {c["name"] for c in inspect(db.engine).get_columns("usage_rollup")}
    finally:
        db.close()
