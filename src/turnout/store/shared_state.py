"""What every gateway replica must see the same, in the SQL store they all share (table ``shared_state``,
migration 0015): one row per shared thing, by name.

- ``changes``: the admin change version. Every admin change any replica takes adds one
  (:meth:`SharedState.bump_changes`); each gateway polls it (:meth:`SharedState.change_version`, one primary-key
  read) and, when it moved, re-reads what it keeps in memory (:mod:`turnout.gateway.peers`).
- ``placement``: the placement override document, the override file's content in the design's format, with its
  own write count; written under the row's lock by :mod:`turnout.state.placement_shared`, which mirrors it into
  each replica's override file. No row: the store has never held the overrides.

Why the store and not Redis or a file: every replica already needs the store (keys, endpoints, aliases and people
live there), it is durable and transactional, and backups and restores already cover it; Redis is optional and
may restart empty, and a file reaches only the processes of one machine.

The functions on a :class:`~sqlalchemy.Connection` are also used inside a restore's own transaction
(:mod:`turnout.state.store_export`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from turnout.store.db import Database, StoreError
from turnout.store.schema import shared_state

__all__ = ["CHANGES", "PLACEMENT", "Document", "Locked", "SharedState", "bump", "read", "restored", "write"]

CHANGES = "changes"
PLACEMENT = "placement"
LOCK_TIMEOUT_S = 10  # PostgreSQL: how long a writer waits for another replica's write of the same row


@dataclass(frozen=True, slots=True)
class Document:
    """A shared row: its write count and its document (None: no document, e.g. no override file)."""

    version: int
    text: str | None


def read(conn: Connection, name: str) -> Document | None:
    """The row ``name``, or None when the store has none."""
    row = conn.execute(select(shared_state.c.version, shared_state.c.document).where(shared_state.c.name == name))
    found = row.first()
    return None if found is None else Document(int(found[0]), found[1])


def write(conn: Connection, name: str, text: str | None, *, now: float) -> Document:
    """Replace the document of ``name`` (creating the row), one more write; the row as written."""
    current = read(conn, name)
    if current is None:
        conn.execute(insert(shared_state).values(name=name, version=1, document=text, updated_at=now))
        return Document(1, text)
    conn.execute(
        update(shared_state)
        .where(shared_state.c.name == name)
        .values(version=shared_state.c.version + 1, document=text, updated_at=now)
    )
    return Document(current.version + 1, text)


def bump(conn: Connection, name: str, *, now: float) -> int:
    """One more write of ``name`` without changing its document (the change version); the new version."""
    done = conn.execute(
        update(shared_state)
        .where(shared_state.c.name == name)
        .values(version=shared_state.c.version + 1, updated_at=now)
    )
    if done.rowcount == 0:
        conn.execute(insert(shared_state).values(name=name, version=1, document=None, updated_at=now))
        return 1
    found = read(conn, name)
    assert found is not None
    return found.version


def restored(conn: Connection, placement: str | None, *, now: float) -> None:
    """Inside a restore's transaction, after the target's own rows were kept: the backup's override document
    (None: the backup had no override file) becomes the store's, and the change version moves, so every
    replica takes the restored state."""
    write(conn, PLACEMENT, placement, now=now)
    bump(conn, CHANGES, now=now)


def _lock(conn: Connection, name: str) -> None:
    """Hold the row ``name`` for the rest of the transaction: a write that changes nothing. PostgreSQL locks the
    row (with a bounded wait); SQLite starts its one write transaction, so readers go on and writers wait."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_S}s'")
    conn.execute(update(shared_state).where(shared_state.c.name == name).values(version=shared_state.c.version))


class Locked:
    """A shared row inside its writer's transaction: ``current`` as it is now (no other writer can change it
    until the transaction ends), :meth:`write` to replace it."""

    def __init__(self, conn: Connection, name: str, current: Document | None) -> None:
        self._conn, self.name, self.current = conn, name, current

    def write(self, text: str | None, *, now: float) -> Document:
        self.current = write(self._conn, self.name, text, now=now)
        return self.current


class SharedState:
    def __init__(self, db: Database) -> None:
        self.db = db

    def change_version(self) -> int:
        """The admin change version (0 before the first change). Raises StoreError."""
        with self.db.begin() as conn:
            found = read(conn, CHANGES)
        return 0 if found is None else found.version

    def bump_changes(self, *, now: float) -> int:
        """Announce an admin change to every replica; the new version. Raises StoreError."""
        with self.db.begin() as conn:
            return bump(conn, CHANGES, now=now)

    def document(self, name: str) -> Document | None:
        """The row ``name`` as committed now, or None. Raises StoreError."""
        with self.db.begin() as conn:
            return read(conn, name)

    def create(self, name: str, text: str | None, *, now: float) -> bool:
        """Create the row ``name`` with ``text`` unless it exists (another replica was first): whether it was
        created. Raises StoreError."""
        try:
            with self.db.engine.begin() as conn:
                conn.execute(insert(shared_state).values(name=name, version=1, document=text, updated_at=now))
        except IntegrityError:
            return False
        except SQLAlchemyError as exc:
            raise StoreError(f"database error: {exc.__class__.__name__}: {str(exc).splitlines()[0]}") from None
        return True

    @contextmanager
    def locked(self, name: str) -> Iterator[Locked]:
        """A transaction holding the row ``name``: what is written through the :class:`Locked` is committed when
        the block ends without an error, and rolled back otherwise. Raises StoreError."""
        with self.db.begin() as conn:
            _lock(conn, name)
            yield Locked(conn, name, read(conn, name))
