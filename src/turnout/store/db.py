"""The database handle: engine, migrations, error translation.

Sync SQLAlchemy Core; the gateway calls it from worker threads (``asyncio.to_thread``), never on the
event loop's hot path.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import SQLAlchemyError

__all__ = ["Database", "StoreError", "database_url"]

_MIGRATIONS = Path(__file__).parent / "migrations"


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

    @property
    def safe_url(self) -> str:
        """The URL without its password, for messages."""
        head, sep, tail = self.url.partition("@")
        if not sep:
            return self.url
        scheme, _, creds = head.partition("://")
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{tail}"

    def migrate(self) -> None:
        """Bring the schema to the latest revision (idempotent)."""
        cfg = AlembicConfig()
        cfg.set_main_option("script_location", str(_MIGRATIONS))
        try:
            with self.engine.begin() as conn:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot migrate {self.safe_url}: {exc.__class__.__name__}: {exc}") from None

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A transaction; SQLAlchemy errors become StoreError."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except SQLAlchemyError as exc:
            raise StoreError(f"database error: {exc.__class__.__name__}: {str(exc).splitlines()[0]}") from None

    def close(self) -> None:
        self.engine.dispose()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
