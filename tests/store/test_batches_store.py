"""The Batch API's store (turnout.store.batches, migration 0014) on SQLite and PostgreSQL: files per app, batches
with their lease, one answer per line however many runners write it, ending with output and error files, cursor
pages, retention; the migration's schema matches the tables; backups carry it all and a restore brings it back."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from tests.state.test_backup import NOW, make_state
from turnout.config import load_settings
from turnout.state.backup import create_backup
from turnout.state.restore import restore_backup
from turnout.store.batches import BatchFile, BatchRecord, BatchStore, FileInUse, Result
from turnout.store.db import Database
from turnout.store.db import database_url as store_url
from turnout.store.schema import metadata

DAY = 86_400.0


def a_file(file_id: str, app: str | None = "web", *, at: float = NOW, lines: int = 3) -> BatchFile:
    return BatchFile(file_id, app, "batch", f"{file_id}.jsonl", 10, lines, at, at + 30 * DAY)


def a_batch(
    batch_id: str, app: str | None = "web", *, at: float = NOW, total: int = 3, file_id: str = "file-1"
) -> BatchRecord:
    return BatchRecord(batch_id, app, 7, "/v1/chat/completions", file_id, "24h", "validating", at, at + DAY, total)


def outputs(batch_id: str) -> tuple[BatchFile, BatchFile]:
    def one(purpose: str) -> BatchFile:
        return BatchFile(f"file-{purpose}-{batch_id}", "web", purpose, f"{batch_id}.jsonl", 0, 0, NOW, NOW + DAY)

    return one("batch_output"), one("batch_error")


@pytest.fixture
def store(database_url: str) -> BatchStore:
    db = Database(database_url)
    db.migrate()
    yield BatchStore(db)  # type: ignore[misc]
    db.close()


def test_files_belong_to_their_app_and_page_by_cursor(store: BatchStore) -> None:
    for n in range(5):
        store.add_file(a_file(f"file-{n}", at=NOW + n), b"content %d" % n)
    store.add_file(a_file("file-open", None), b"x")
    assert store.file("file-1", "web", NOW) is not None and store.file("file-1", "other", NOW) is None
    assert store.file("file-open", None, NOW) is not None and store.file("file-open", "web", NOW) is None
    assert store.file("file-1", "web", NOW + 31 * DAY) is None  # expired: never returned
    assert store.content("file-3") == b"content 3"
    page = store.files("web", NOW, purpose=None, after=None, limit=2, newest_first=True)
    assert page is not None and [f.id for f in page[0]] == ["file-4", "file-3"] and page[1]
    page = store.files("web", NOW, purpose=None, after="file-3", limit=2, newest_first=True)
    assert page is not None and [f.id for f in page[0]] == ["file-2", "file-1"] and page[1]
    page = store.files("web", NOW, purpose="batch", after="file-1", limit=2, newest_first=True)
    assert page is not None and [f.id for f in page[0]] == ["file-0"] and not page[1]
    assert store.files("web", NOW, purpose=None, after="file-open", limit=2, newest_first=True) is None
    assert store.delete_file("file-0", "other") is False and store.delete_file("file-0", "web") is True


def test_batches_page_newest_first_per_app(store: BatchStore) -> None:
    for n in range(5):
        store.add_batch(a_batch(f"batch_{n}", at=NOW + n))
    store.add_batch(a_batch("batch_other", "other"))
    first = store.batches("web", after=None, limit=3)
    assert first is not None and [b.id for b in first[0]] == ["batch_4", "batch_3", "batch_2"] and first[1]
    rest = store.batches("web", after="batch_2", limit=3)
    assert rest is not None and [b.id for b in rest[0]] == ["batch_1", "batch_0"] and not rest[1]
    assert store.batches("web", after="batch_other", limit=3) is None
    assert [b.id for b in store.listing(apps=["other"])] == ["batch_other"]
    assert len(store.listing(status="validating")) == 6


def test_one_answer_per_line_whoever_writes_it(store: BatchStore) -> None:
    store.add_batch(a_batch("batch_a", total=4))
    first = [Result(1, True, b'{"a":1}', 5, 2), Result(2, False, b'{"b":1}', 1, 0)]
    assert store.record("batch_a", first, NOW) == 2
    again = [Result(1, False, b'{"late":1}', 9, 9), Result(3, True, b'{"c":1}', 3, 1)]
    assert store.record("batch_a", again, NOW) == 1  # line 1 keeps its first answer
    record = store.batch("batch_a")
    assert record is not None
    assert (record.completed, record.failed, record.prompt_tokens, record.completion_tokens) == (2, 1, 9, 3)
    assert store.answered("batch_a") == {1, 2, 3}
    assert store.results("batch_a", True) == [(1, b'{"a":1}'), (3, b'{"c":1}')]
    assert store.results("batch_a", True, after=1, limit=1) == [(3, b'{"c":1}')]


def test_runners_racing_on_the_same_lines_count_each_once(store: BatchStore) -> None:
    """Runners in several threads (each its own connection and transaction) write overlapping answers at once."""
    store.add_batch(a_batch("batch_race", total=200))
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def runner(offset: int) -> None:
        try:
            barrier.wait(10)
            for start in range(0, 200, 20):
                lines = range(start + offset + 1, min(start + offset + 31, 201))
                store.record("batch_race", [Result(n, True, b"{}", 1, 1) for n in lines], NOW)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=runner, args=(offset,)) for offset in (0, 5, 10, 15)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    record = store.batch("batch_race")
    assert record is not None and (record.completed, record.prompt_tokens) == (200, 200)
    assert len(store.results("batch_race", True, limit=1000)) == 200


def test_the_lease_is_one_runner_at_a_time(store: BatchStore) -> None:
    store.add_batch(a_batch("batch_l"))
    assert store.runnable(NOW, free_only=True) == ["batch_l"]
    assert store.claim("batch_l", "a", NOW, 30) is True
    assert store.claim("batch_l", "b", NOW + 10, 30) is False  # held
    assert store.runnable(NOW + 10, free_only=True) == [] and store.runnable(NOW + 10, free_only=False) == ["batch_l"]
    assert store.renew("batch_l", "a", NOW + 20, 30) is True and store.renew("batch_l", "b", NOW + 20, 30) is False
    assert store.claim("batch_l", "b", NOW + 49, 30) is False
    assert store.claim("batch_l", "b", NOW + 51, 30) is True  # a lapsed: taken over
    assert store.renew("batch_l", "a", NOW + 52, 30) is False  # a learns it lost it
    store.release("batch_l", "a")  # not a's to give back
    assert store.claim("batch_l", "a", NOW + 53, 30) is False
    store.release("batch_l", "b")
    assert store.claim("batch_l", "a", NOW + 53, 30) is True


def test_cancel_and_end_with_output_and_error_files(store: BatchStore) -> None:
    store.add_file(a_file("file-1"), b"x")
    store.add_batch(a_batch("batch_e", total=3))
    assert store.set_status("batch_e", "in_progress", NOW, only_from=("validating",)) is True
    with pytest.raises(FileInUse):
        store.delete_file("file-1", "web")
    store.record("batch_e", [Result(1, True, b'{"ok":"\xc3\xa9"}'), Result(2, False, b'{"no":1}')], NOW)
    cancelling = store.request_cancel("batch_e", NOW + 1)
    assert cancelling is not None and cancelling.status == "cancelling" and cancelling.cancelling_at == NOW + 1
    store.record("batch_e", [Result(3, False, b'{"never":1}')], NOW + 2)
    ended = store.end("batch_e", "cancelled", NOW + 2, outputs("batch_e"))
    assert ended is not None and ended.status == "cancelled" and ended.ended_at == NOW + 2
    assert ended.output_file_id == "file-batch_output-batch_e" and ended.error_file_id == "file-batch_error-batch_e"
    out = store.file("file-batch_output-batch_e", "web", NOW)
    assert out is not None and (out.lines, out.bytes, out.batch_id) == (1, len(b'{"ok":"\xc3\xa9"}\n'), "batch_e")
    err = store.file("file-batch_error-batch_e", "web", NOW)
    assert err is not None and err.lines == 2
    assert store.request_cancel("batch_e", NOW + 3) is not None  # ended: left as it is
    assert store.batch("batch_e").status == "cancelled"  # type: ignore[union-attr]
    assert store.end("batch_e", "completed", NOW + 4, outputs("batch_e")).status == "cancelled"  # type: ignore[union-attr]
    assert store.delete_file("file-1", "web") is True  # no longer read by a running batch


def test_a_batch_with_no_error_has_no_error_file(store: BatchStore) -> None:
    store.add_batch(a_batch("batch_ok", total=1))
    store.record("batch_ok", [Result(1, True, b"{}")], NOW)
    ended = store.end("batch_ok", "completed", NOW, outputs("batch_ok"))
    assert ended is not None and ended.error_file_id is None and ended.output_file_id is not None
    assert ended.finalizing_at == NOW and ended.completed_at == NOW


def test_retention_deletes_ended_batches_with_their_files(store: BatchStore) -> None:
    store.add_file(a_file("file-old", at=NOW - 40 * DAY), b"x")  # past its expiry, read by nothing
    store.add_file(a_file("file-running", at=NOW - 40 * DAY), b"x")  # past its expiry, but a running batch reads it
    store.add_batch(a_batch("batch_running", file_id="file-running"))
    store.add_file(a_file("file-ended"), b"x")
    store.add_batch(a_batch("batch_ended", file_id="file-ended"))
    store.record("batch_ended", [Result(1, True, b"{}")], NOW - 31 * DAY)
    store.end("batch_ended", "completed", NOW - 31 * DAY, outputs("batch_ended"))
    assert store.purge(NOW, 30 * DAY) == (1, 1)
    assert store.batch("batch_ended") is None and store.answered("batch_ended") == set()
    assert store.file("file-batch_output-batch_ended", "web", NOW - 31 * DAY) is None
    assert store.content("file-old") is None and store.content("file-running") == b"x"
    assert store.batch("batch_running") is not None and store.content("file-ended") == b"x"


def test_the_migration_makes_exactly_the_tables(database_url: str) -> None:
    db = Database(database_url)
    db.migrate()
    try:
        with db.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
        # what 0014 made (the other tables' own small differences, such as SQLite's INTEGER minute, are older)
        assert [d for d in diff if "batch" in repr(d)] == []
    finally:
        db.close()
    assert {"batch_files", "batches", "batch_results"} <= set(metadata.tables)


def test_backups_carry_files_batches_and_answers(tmp_path: Path, database_url: str) -> None:
    config = make_state(tmp_path, database=None if database_url.startswith("sqlite") else database_url)
    settings = load_settings(config, env={})
    db = Database(store_url(settings.storage.database_url, settings.data_dir))
    db.migrate()
    store = BatchStore(db)
    store.add_file(a_file("file-1"), b'{"custom_id": "a"}\n')
    store.add_batch(a_batch("batch_b"))
    store.record("batch_b", [Result(1, True, b'{"answer": 1}', 4, 2)], NOW)
    db.close()
    archive = tmp_path / "backup.zip"
    create_backup(settings, archive, now=NOW)
    db = Database(store_url(settings.storage.database_url, settings.data_dir))
    store = BatchStore(db)
    store.record("batch_b", [Result(2, True, b"{}")], NOW)  # after the backup: gone after the restore
    store.add_file(a_file("file-later"), b"later")
    db.close()
    restore_backup(archive, config, env={})
    db = Database(store_url(settings.storage.database_url, settings.data_dir))
    store = BatchStore(db)
    try:
        assert store.content("file-1") == b'{"custom_id": "a"}\n' and store.content("file-later") is None
        record = store.batch("batch_b")
        assert record is not None and (record.completed, record.prompt_tokens) == (1, 4)
        assert store.results("batch_b", True) == [(1, b'{"answer": 1}')]
    finally:
        db.close()


def test_the_migration_goes_down_and_up_again(database_url: str) -> None:
    from alembic import command
    from alembic.config import Config as AlembicConfig
    from sqlalchemy import inspect

    from turnout.store.db import _MIGRATIONS

    db = Database(database_url)
    db.migrate()
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    try:
        with db.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0013")
        tables = set(inspect(db.engine).get_table_names())
        assert not tables & {"batch_files", "batches", "batch_results"}
        assert "batch_id" not in {c["name"] for c in inspect(db.engine).get_columns("usage_rollup")}
        db.migrate()
        BatchStore(db).add_batch(a_batch("batch_again"))
    finally:
        db.close()
