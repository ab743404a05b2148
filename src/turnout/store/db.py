"""The database handle: engine, migrations, error translation.

Sync SQLAlchemy Core; the gateway calls it from worker threads (``asyncio.to_thread``), never on the
event loop's hot path. Alembic is imported only when the schema is behind the newest migration file: a
CLI command on an up-to-date store (``turnout key list``) reads the revision and goes on.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import ConnectionPoolEntry

__all__ = ["Database", "StoreError", "database_url"]

_MIGRATIONS = Path(__file__).parent / "migrations"
_MIGRATION_LOCK = 0x7475726E6F7574  # "turnout": the PostgreSQL advisory lock key of migrations
log = logging.getLogger("turnout.store")


class StoreError(Exception):
    """The database failed or refused an operation; the message says which and why."""


def database_url(configured: str | None, data_dir: Path) -> str:
    """The configured URL, or SQLite in the data dir. ``postgresql://`` means psycopg 3."""
    if not configured:
        return f"sqlite:///{data_dir / 'turnout.db'}"
    if configured.startswith("postgresql://"):
        return "postgresql+psycopg://" + configured.removeprefix("postgresql://")
    if configured.startswith("postgres://"):
        return "postgresql+psycopg://" + configured.removeprefix("postgres://")
    return configured


class Database:
    def __init__(self, url: str) -> None:
        self.url = url
        self.dialect = url.split(":", 1)[0].split("+", 1)[0]
        options: dict[str, Any] = {"future": True}
        if self.dialect == "sqlite":
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            options["connect_args"] = {"check_same_thread": False, "timeout": 30}
        else:
            options.update(pool_pre_ping=True, pool_size=5, max_overflow=5)
        try:
            self.engine: Engine = create_engine(url, **options)
        except (SQLAlchemyError, ImportError, ValueError) as exc:
            raise StoreError(f"cannot open database {self.safe_url}: {exc}") from None
        if self.dialect == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self.closed = False
        event.listen(self.engine, "checkin", self._given_back)

    @classmethod
    def migrated(cls, url: str) -> Database:
        """The store at ``url``, brought to the current schema (:meth:`migrate`); closed again when that fails, so
        that no pooled connection is left to the garbage collector (psycopg warns of each one it finds open)."""
        database = cls(url)
        try:
            database.migrate()
        except BaseException:
            database.close()
            raise
        return database

    @property
    def safe_url(self) -> str:
        """The URL without its password, for messages."""
        head, sep, tail = self.url.partition("@")
        if not sep:
            return self.url
        scheme, _, creds = head.partition("://")
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{tail}"

    def migrate(self) -> None:
        """Bring the schema to the latest revision (idempotent). On PostgreSQL the migration holds an advisory
        lock for its transaction: gateway replicas starting at once on a new database wait for the first one's
        migration, then find the schema at head (Alembic reads the revision after the lock is granted)."""
        if self._at_head():
            return
        from alembic import command
        from alembic.config import Config as AlembicConfig

        cfg = AlembicConfig()
        cfg.set_main_option("script_location", str(_MIGRATIONS))
        before = self._revision()
        try:
            with self.engine.begin() as conn:
                if self.dialect == "postgresql":  # replicas starting at once on a new store migrate one by one
                    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot migrate {self.safe_url}: {exc.__class__.__name__}: {exc}") from None
        after = self._revision()
        if after != before:  # Alembic's own lines (one per step, and its plugins) are at its loggers' levels
            log.info("store %s: schema %s -> %s", self.safe_url, before or "(new)", after)

    def _revision(self) -> str | None:
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
        except SQLAlchemyError:
            return None
        return ",".join(rows) or None

    def _at_head(self) -> bool:
        """True when the store's revision is the single head of the migration files; any doubt (no
        revision table, a file this cannot read, branches) says False and Alembic decides."""
        head = migration_head()
        return head is not None and self._revision() == head

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A transaction; SQLAlchemy errors become StoreError."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except SQLAlchemyError as exc:
            raise StoreError(f"database error: {exc.__class__.__name__}: {str(exc).splitlines()[0]}") from None

    def close(self) -> None:
        """Close the pooled connections. One that a thread still holds (its work outlived the task that awaited it)
        is closed when given back: SQLAlchemy's dispose closes only the idle ones, and leaves the rest in a pool
        nothing refers to, for the garbage collector to find open."""
        self.closed = True
        self.engine.dispose()

    def _given_back(self, _dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        if self.closed:
            record.invalidate()  # closes it; a later use of the engine opens a new one


_REVISION = re.compile(r"^revision(?:\s*:[^=]+)?\s*=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)
_DOWN_REVISION = re.compile(r"^down_revision(?:\s*:[^=]+)?\s*=\s*(None|['\"]([^'\"]+)['\"])\s*$", re.MULTILINE)


def migration_head(versions: Path = _MIGRATIONS / "versions") -> str | None:
    """The newest revision of the migration files, read from their ``revision`` / ``down_revision`` lines
    without importing Alembic; None when that is not certain (a file that declares them otherwise, a merge,
    two heads), so that the caller runs Alembic."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in versions.glob("*.py"):
        if path.name == "__init__.py":
            continue
        source = path.read_text(encoding="utf-8")
        revision, down = _REVISION.search(source), _DOWN_REVISION.search(source)
        if revision is None or down is None:
            return None
        revisions.add(revision.group(1))
        if down.group(2):
            parents.add(down.group(2))
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
