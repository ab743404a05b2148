"""Runtime model aliases in the SQL store: what the admin API and `turnout alias` set (the config's own aliases
live in config.json and are never written here).

One row per alias, keyed by its comparison form (:func:`turnout.core.names.canonical`), so ``foo`` and
``foo:latest`` are one row. ``put`` and ``remove`` take a ``check`` called inside the transaction with the
current row (or None) and every runtime alias: the admin API's If-Match, and the rule that aliases never chain
(:func:`turnout.core.aliases.alias_problem`), are decided against what is stored at that moment, not what a
process read earlier. Alias writers take the table's write lock first (:func:`_lock`), so two of them (two
replicas, the CLI and a gateway) check and write one after the other: ``a -> b`` and ``b -> c`` written at the same
instant cannot both pass. Used by :mod:`turnout.gateway.aliases` (reads), the admin API and the CLI (writes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, false, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from turnout.core.aliases import Alias, AliasSource
from turnout.core.names import canonical, model_name_problem
from turnout.store.db import Database, StoreError
from turnout.store.keys import StaleRecord
from turnout.store.schema import model_aliases

__all__ = ["AliasRecord", "AliasStore"]


@dataclass(frozen=True, slots=True)
class AliasRecord:
    name: str
    model: str
    created_at: float
    updated_at: float

    def alias(self) -> Alias:
        return Alias(self.name, self.model, AliasSource.RUNTIME)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model, "created_at": self.created_at, "updated_at": self.updated_at}


# (the row of that name or None, every stored alias) -> raises to refuse the write
Check = Callable[[AliasRecord | None, list[AliasRecord]], None]


def _record(row: Any) -> AliasRecord:
    return AliasRecord(row["name"], row["model"], float(row["created_at"]), float(row["updated_at"]))


def _lock(conn: Connection) -> None:
    """Serialise alias writers for the rest of the transaction; readers are not held up.

    PostgreSQL: a table lock that conflicts with itself. SQLite: a write statement that changes nothing starts
    the write transaction (the database's one writer), and the reads of the check then happen inside it."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("LOCK TABLE model_aliases IN SHARE ROW EXCLUSIVE MODE"))
    else:
        conn.execute(update(model_aliases).where(false()).values(name=model_aliases.c.name))


class AliasStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def all(self) -> list[AliasRecord]:
        """Every runtime alias, by name. Raises StoreError."""
        with self.db.begin() as conn:
            return self._all(conn)

    def _all(self, conn: Connection) -> list[AliasRecord]:
        rows = conn.execute(select(model_aliases).order_by(model_aliases.c.name)).mappings().all()
        return [_record(r) for r in rows]

    def get(self, name: str) -> AliasRecord | None:
        with self.db.begin() as conn:
            return self._get(conn, name)

    def _get(self, conn: Connection, name: str) -> AliasRecord | None:
        row = conn.execute(select(model_aliases).where(model_aliases.c.canonical == canonical(name))).mappings().first()
        return None if row is None else _record(row)

    def put(
        self, name: str, model: str, *, now: float, check: Check | None = None
    ) -> tuple[AliasRecord | None, AliasRecord]:
        """Set ``name`` to stand for ``model`` (a new alias, or a new model or spelling for one): (before, after).
        Raises StoreError for a name or model no column can hold, StaleRecord when the row changed between the
        check and the write (another replica), and whatever ``check`` raises."""
        for value, field in ((name, "name"), (model, "model")):
            problem = model_name_problem(value, field)
            if problem is not None:
                raise StoreError(problem)
        key = canonical(name)
        with self.db.begin() as conn:
            _lock(conn)
            before = self._get(conn, name)
            if check is not None:
                check(before, self._all(conn))
            if before is None:
                try:
                    conn.execute(
                        insert(model_aliases).values(
                            canonical=key, name=name, model=model, created_at=now, updated_at=now
                        )
                    )
                except IntegrityError:  # set meanwhile by another replica
                    stale = f'alias "{name}" was set by someone else meanwhile; reload it and retry'
                    raise StaleRecord(stale) from None
            else:
                done = conn.execute(
                    update(model_aliases)
                    .where(model_aliases.c.canonical == key, model_aliases.c.updated_at == before.updated_at)
                    .values(name=name, model=model, updated_at=max(now, before.updated_at + 1e-6))
                )
                if done.rowcount != 1:
                    raise StaleRecord(f'alias "{name}" was changed by someone else meanwhile; reload it and retry')
            after = self._get(conn, name)
            assert after is not None
            return before, after

    def remove(self, name: str, *, check: Check | None = None) -> AliasRecord:
        """Remove the runtime alias ``name``; KeyError when there is none. Raises StaleRecord as :meth:`put`."""
        with self.db.begin() as conn:
            _lock(conn)
            before = self._get(conn, name)
            if check is not None:
                check(before, self._all(conn))
            if before is None:
                raise KeyError(f'no alias "{name}" was set through the admin API or the CLI (see: turnout alias list)')
            done = conn.execute(
                delete(model_aliases).where(
                    model_aliases.c.canonical == canonical(name), model_aliases.c.updated_at == before.updated_at
                )
            )
            if done.rowcount != 1:
                raise StaleRecord(f'alias "{name}" was changed by someone else meanwhile; reload it and retry')
            return before
