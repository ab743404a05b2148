"""Consistent exports of the SQL store for backups, and loading them back.

SQLite: SQLite's online backup API copies the live database page by page into a standalone file (rollback
journal, no WAL beside it), which is restored the same way: the backup API copies the checked copy *into*
the live database in one write transaction, so WAL files, open connections and a running gateway stay
consistent (renaming a file over a WAL-mode database would not be).

PostgreSQL: every Turnout table (``turnout.store.schema``) as JSON lines, read in one REPEATABLE READ
transaction; restored in one transaction that drops the tables, migrates an empty schema to the backup's
revision, loads the rows, resets the id sequences and migrates on to head. A failure anywhere rolls it all
back.

Browser sessions (``admin_sessions``) are not exported: a restore keeps the sessions of the target, so an
operator restoring from the admin UI stays signed in. Nor is ``shared_state`` (:mod:`turnout.store.shared_state`):
the backup holds the placement overrides as the override file, which a restore writes into the store's row, and
the target's change version only ever moves on (the restore moves it once more), so every replica re-reads. The
audit log is append-only, and a restore keeps it so: the target's entries newer than the backup's newest are
appended to the restored log.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson
from sqlalchemy import Connection, MetaData, Table, create_engine, inspect, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.types import JSON, DateTime, Integer, LargeBinary

import turnout.store.db as store_db
from turnout.store import shared_state
from turnout.store.db import StoreError
from turnout.store.schema import metadata

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

__all__ = [
    "KEPT_TABLES",
    "StoreExportError",
    "current_revision",
    "head_revision",
    "known_revisions",
    "postgres_export",
    "postgres_restore",
    "sqlite_export",
    "sqlite_restore",
    "sqlite_revision",
]

KEPT_TABLES = ("admin_sessions", "shared_state")  # the target's own: never exported, kept by a restore
_MIGRATIONS = Path(store_db.__file__).parent / "migrations"
_BATCH = 1000


class StoreExportError(Exception):
    """The store cannot be exported or loaded; the message says which part and why."""


# Alembic is imported where it is used: the gateway imports this module (backup routes) but runs no migration
# here, and Alembic with its templates is about 12 MB of resident memory.
def _script() -> ScriptDirectory:
    from alembic.config import Config as AlembicConfig
    from alembic.script import ScriptDirectory

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    return ScriptDirectory.from_config(cfg)


def known_revisions() -> frozenset[str]:
    return frozenset(r.revision for r in _script().walk_revisions())


def head_revision() -> str:
    head = _script().get_current_head()
    assert head is not None
    return head


def _upgrade(conn: Connection, revision: str) -> None:
    from alembic import command
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, revision)


def current_revision(conn: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


# -- SQLite ----------------------------------------------------------------------------------------


def sqlite_export(source: Path, dest: Path) -> str:
    """Copy the live database at ``source`` into a new standalone file ``dest``; return its schema revision."""
    try:
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as exc:
        raise StoreExportError(f"cannot open the SQLite store {source}: {exc}") from None
    try:
        out = sqlite3.connect(dest)
        try:
            src.backup(out)
            out.execute("PRAGMA journal_mode=DELETE")  # standalone: no -wal file belongs to it
            for table in KEPT_TABLES:
                if _sqlite_has(out, table):
                    out.execute(f'DELETE FROM "{table}"')
            out.commit()
        finally:
            out.close()
    except sqlite3.Error as exc:
        raise StoreExportError(f"cannot copy the SQLite store {source}: {exc}") from None
    finally:
        src.close()
    return sqlite_revision(dest)


def _sqlite_has(conn: sqlite3.Connection, table: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)).fetchone()
    return row is not None


def sqlite_revision(path: Path) -> str:
    """The Alembic revision of a standalone SQLite file, after an integrity check."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            check = conn.execute("PRAGMA integrity_check").fetchone()
            if check is None or check[0] != "ok":
                raise StoreExportError(f"the SQLite store fails its integrity check: {check and check[0]}")
            if not _sqlite_has(conn, "alembic_version"):
                raise StoreExportError("the SQLite store has no schema revision (alembic_version)")
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise StoreExportError(f"the SQLite store cannot be read: {exc}") from None
    if row is None:
        raise StoreExportError("the SQLite store has no schema revision (alembic_version is empty)")
    return str(row[0])


def sqlite_prepare(staged: Path, live: Path, *, placement: str | None, now: float) -> None:
    """Bring the staged copy to head and carry over from the live database what a restore keeps: its browser
    sessions, its shared state, and its audit entries newer than the backup's (the audit log is append-only: a
    restore never erases the record of what happened after the backup, the restore included); then the backup's
    override document ``placement`` becomes the store's (:func:`turnout.store.shared_state.restored`)."""
    engine = create_engine(f"sqlite:///{staged}")
    try:
        with engine.begin() as conn:
            _upgrade(conn, "head")
        if live.exists():
            _carry_kept(staged, live)
        with engine.begin() as conn:
            shared_state.restored(conn, placement, now=now)
    except SQLAlchemyError as exc:
        raise StoreExportError(f"cannot migrate the backup's store to this version: {exc}") from None
    finally:
        engine.dispose()


def _carry_kept(staged: Path, live: Path) -> None:
    try:
        db = sqlite3.connect(staged)
        try:
            db.execute("ATTACH DATABASE ? AS live", (f"file:{live}?mode=ro",))
            for table in KEPT_TABLES:
                mine = [r[1] for r in db.execute(f'PRAGMA main.table_info("{table}")')]
                theirs = [r[1] for r in db.execute(f'PRAGMA live.table_info("{table}")')]
                if mine and mine == theirs:
                    db.execute(f'DELETE FROM main."{table}"')
                    db.execute(f'INSERT INTO main."{table}" SELECT * FROM live."{table}"')
            ours = [r[1] for r in db.execute('PRAGMA main.table_info("audit")')]
            live_columns = {r[1] for r in db.execute('PRAGMA live.table_info("audit")')}
            common = ", ".join(f'"{c}"' for c in ours if c in live_columns and c != "id")
            if ours and "ts" in live_columns:
                db.execute(
                    f"INSERT INTO main.audit ({common}) SELECT {common} FROM live.audit "
                    "WHERE ts > (SELECT COALESCE(MAX(ts), -1) FROM main.audit) ORDER BY id"
                )
            db.commit()
            db.execute("DETACH DATABASE live")
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise StoreExportError(
            f"cannot carry sessions, shared state and later audit entries into the restored store: {exc}"
        ) from None


def sqlite_restore(staged: Path, live: Path) -> None:
    """Copy ``staged`` into the live database in one transaction (creating it when missing)."""
    live.parent.mkdir(parents=True, exist_ok=True)
    try:
        src = sqlite3.connect(f"file:{staged}?mode=ro", uri=True)
        try:
            dst = sqlite3.connect(live, timeout=30)
            try:
                src.backup(dst)
            finally:
                dst.close()
        finally:
            src.close()
    except sqlite3.Error as exc:
        raise StoreExportError(f"cannot write the SQLite store {live}: {exc}") from None


# -- PostgreSQL ------------------------------------------------------------------------------------


def _exported(conn: Connection) -> list[Table]:
    present = set(inspect(conn).get_table_names())
    names = [t.name for t in metadata.sorted_tables if t.name in present and t.name not in KEPT_TABLES]
    reflected = MetaData()
    reflected.reflect(conn, only=names)
    order = {name: i for i, name in enumerate(names)}
    return sorted(reflected.sorted_tables, key=lambda t: order[t.name])


def _encode(value: Any) -> Any:
    if isinstance(value, bytes | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    raise TypeError(f"a value of type {type(value).__name__} cannot be exported")


def postgres_export(url: str, member: Callable[[str], contextlib.AbstractContextManager[IO[bytes]]]) -> str:
    """Write ``store/<table>.jsonl`` through ``member(path)`` for every table, in one snapshot; return the
    schema revision."""
    engine = create_engine(url)
    try:
        with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn, conn.begin():
            revision = current_revision(conn)
            if revision is None:
                raise StoreExportError("the PostgreSQL store has no schema revision; start the gateway once first")
            for table in _exported(conn):
                order = list(table.primary_key.columns) or list(table.columns)
                with member(f"store/{table.name}.jsonl") as out:
                    for row in conn.execute(select(table).order_by(*order)).mappings():
                        record = {str(k): v for k, v in row.items()}  # reflected names are str subclasses
                        out.write(orjson.dumps(record, default=_encode) + b"\n")
    except SQLAlchemyError as exc:
        raise StoreExportError(f"cannot export the PostgreSQL store: {exc.__class__.__name__}: {exc}") from None
    except TypeError as exc:
        raise StoreExportError(f"cannot export the PostgreSQL store: {exc}") from None
    finally:
        engine.dispose()
    return revision


def _decode(table: Table, row: dict[str, Any], where: str) -> dict[str, Any]:
    unknown = set(row) - set(table.columns.keys())
    if unknown:
        raise StoreExportError(f"{where}: column(s) {sorted(unknown)} are not in table {table.name}")
    out = dict(row)
    for name, value in row.items():
        kind = table.columns[name].type
        if value is None or isinstance(kind, JSON):
            continue
        if isinstance(kind, LargeBinary):
            out[name] = base64.b64decode(value)
        elif isinstance(kind, DateTime):
            out[name] = dt.datetime.fromisoformat(value)
    return out


def _rows(lines: Iterator[bytes], table: Table, path: str) -> Iterator[dict[str, Any]]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise StoreExportError(f"{path} line {number}: not JSON: {exc}") from None
        if not isinstance(row, dict):
            raise StoreExportError(f"{path} line {number}: not a JSON object")
        yield _decode(table, row, f"{path} line {number}")


def postgres_restore(
    url: str,
    revision: str,
    tables: list[str],
    member: Callable[[str], contextlib.AbstractContextManager[IO[bytes]]],
    *,
    placement: str | None,
    now: float,
) -> dict[str, int]:
    """Replace the store's content with the exported ``tables`` (read through ``member``) in one transaction,
    the backup's override document ``placement`` included (:func:`turnout.store.shared_state.restored`); return
    rows loaded per table."""
    newest = _newest_audit(member) if "audit" in tables else None
    engine = create_engine(url)
    loaded: dict[str, int] = {}
    try:
        with engine.begin() as conn:
            kept = _read_kept(conn)
            later = _later_audit(conn, newest)
            metadata.drop_all(conn, checkfirst=True)
            conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
            _upgrade(conn, revision)
            present = MetaData()
            present.reflect(conn)
            for name in tables:
                table = present.tables.get(name)
                if table is None:
                    raise StoreExportError(f"store/{name}.jsonl: schema revision {revision} has no table {name}")
                count = 0
                with member(f"store/{name}.jsonl") as handle:
                    batch: list[dict[str, Any]] = []
                    for row in _rows(iter(handle), table, f"store/{name}.jsonl"):
                        batch.append(row)
                        if len(batch) >= _BATCH:
                            conn.execute(table.insert(), batch)
                            count, batch = count + len(batch), []
                    if batch:
                        conn.execute(table.insert(), batch)
                        count += len(batch)
                loaded[name] = count
                _reset_sequence(conn, table)
            _upgrade(conn, "head")
            _write_kept(conn, kept)
            _append_audit(conn, later)
            shared_state.restored(conn, placement, now=now)
    except SQLAlchemyError as exc:
        raise StoreExportError(
            f"cannot load the backup into the PostgreSQL store (nothing was changed): {exc.__class__.__name__}: "
            f"{str(exc).splitlines()[0]}"
        ) from None
    except StoreError as exc:
        raise StoreExportError(str(exc)) from None
    finally:
        engine.dispose()
    return loaded


def _reset_sequence(conn: Connection, table: Table) -> None:
    keys = list(table.primary_key.columns)
    if len(keys) != 1 or not isinstance(keys[0].type, Integer):
        return
    column = keys[0].name
    conn.execute(
        text(
            f"SELECT setval(pg_get_serial_sequence(:table, :column), "
            f'COALESCE((SELECT MAX("{column}") FROM "{table.name}"), 0) + 1, false)'
        ),
        {"table": table.name, "column": column},
    )


def _read_kept(conn: Connection) -> dict[str, list[dict[str, Any]]]:
    present = set(inspect(conn).get_table_names())
    kept: dict[str, list[dict[str, Any]]] = {}
    for name in KEPT_TABLES:
        if name in present:
            table = Table(name, MetaData(), autoload_with=conn)
            kept[name] = [dict(r) for r in conn.execute(select(table)).mappings()]
    return kept


def _write_kept(conn: Connection, kept: dict[str, list[dict[str, Any]]]) -> None:
    for name, rows in kept.items():
        if not rows:
            continue
        table = Table(name, MetaData(), autoload_with=conn)
        if set(rows[0]) == set(table.columns.keys()):
            conn.execute(table.delete())
            conn.execute(table.insert(), rows)


def _newest_audit(member: Callable[[str], contextlib.AbstractContextManager[IO[bytes]]]) -> float:
    newest = -1.0
    with member("store/audit.jsonl") as handle:
        for line in handle:
            if line.strip():
                with contextlib.suppress(orjson.JSONDecodeError, TypeError, ValueError, AttributeError):
                    newest = max(newest, float(orjson.loads(line).get("ts")))
    return newest


def _later_audit(conn: Connection, newest: float | None) -> list[dict[str, Any]]:
    if "audit" not in set(inspect(conn).get_table_names()):
        return []
    table = Table("audit", MetaData(), autoload_with=conn)
    query = select(table).order_by(table.c.id)
    if newest is not None:
        query = query.where(table.c.ts > newest)
    return [{str(k): v for k, v in r.items() if k != "id"} for r in conn.execute(query).mappings()]


def _append_audit(conn: Connection, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    table = Table("audit", MetaData(), autoload_with=conn)
    columns = set(table.columns.keys())
    conn.execute(table.insert(), [{k: v for k, v in r.items() if k in columns} for r in rows])
