"""Runtime model aliases in the store, on SQLite and PostgreSQL: one row per name (either spelling), checks run
inside the transaction against what is stored then, one writer at a time, the usage rows' alias column, and the
migration both ways."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import inspect

from turnout.core.aliases import AliasTable, alias_problem
from turnout.store.aliases import AliasRecord, AliasStore
from turnout.store.db import Database, StoreError
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


def test_two_writers_check_and_write_one_after_the_other(db: Database) -> None:
    """``a -> b`` and ``b -> c`` written at the same instant (two replicas): each check would pass against what
    the other has not written yet, so the second writer must wait for the first and then be refused."""
    store = AliasStore(db)
    gate = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def writer(name: str, target: str) -> None:
        def check(before: AliasRecord | None, stored: list[AliasRecord]) -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                gate.wait(timeout=2)  # both inside their check at once, unless one waits for the other
            table = AliasTable(r.alias() for r in stored)
            problem = alias_problem(name, target, table)
            if problem is not None:
                raise ValueError(problem.message)

        try:
            store.put(name, target, now=NOW, check=check)
            outcomes[name] = "written"
        except ValueError as exc:
            outcomes[name] = str(exc)

    threads = [threading.Thread(target=writer, args=pair) for pair in (("a", "b"), ("b", "c"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes.values())[-1] == "written" and "aliases do not chain" in sorted(outcomes.values())[0], (
        outcomes
    )
    assert len(store.all()) == 1


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
            command.downgrade(cfg, "0012")  # (whatever came after it goes too)
        names = inspect(db.engine).get_table_names()
        assert "model_aliases" not in names
        assert "alias" not in {c["name"] for c in inspect(db.engine).get_columns("usage_rollup")}
        db.migrate()
        assert AliasStore(db).all() == []
        assert "alias" in {c["name"] for c in inspect(db.engine).get_columns("usage_rollup")}
    finally:
        db.close()
