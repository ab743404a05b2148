"""Stored answers of the OpenAI Responses API: what ``store`` keeps and ``previous_response_id``, ``GET`` and
``DELETE /v1/responses/{id}`` read.

A stored response belongs to the app whose key asked for it (``app``; None: asked without a key, under open access)
and is found only by that app's keys: to any other it does not exist. It holds the whole conversation it answered
(``input_items``), so that a continuation needs one read, and it expires (``expires_at``): an expired one is never
returned, and :meth:`ResponseStore.purge` deletes them. Sync, like the rest of the store: the gateway calls it
from worker threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Insert, and_, delete, select
from sqlalchemy.dialects import postgresql, sqlite

from turnout.store.db import Database
from turnout.store.schema import responses

__all__ = ["ResponseStore", "StoredResponse"]


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    app: str | None
    model: str
    previous_response_id: str | None
    created_at: float
    expires_at: float
    input_items: list[dict[str, Any]]
    response: dict[str, Any]


class ResponseStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._upsert = _upsert(db.dialect)  # made once: building it costs more than running it

    def put(self, record: StoredResponse) -> None:
        """Keep ``record`` (replacing one of the same id). Raises StoreError."""
        self.put_many([record])

    def put_many(self, records: list[StoredResponse]) -> None:
        """Keep every record, in one transaction (each replacing one of the same id: an upsert). Raises
        StoreError."""
        rows = [
            {
                "id": r.id,
                "app": r.app,
                "model": r.model,
                "previous_response_id": r.previous_response_id,
                "created_at": r.created_at,
                "expires_at": r.expires_at,
                "input_items": r.input_items,
                "response": r.response,
            }
            for r in {r.id: r for r in records}.values()  # an id twice in one statement: the last one
        ]
        with self.db.begin() as conn:
            conn.execute(self._upsert, rows)

    def get(self, response_id: str, app: str | None, now: float) -> StoredResponse | None:
        """The response ``response_id`` of ``app``, unless it expired. Raises StoreError."""
        with self.db.begin() as conn:
            row = conn.execute(select(responses).where(_mine(response_id, app), responses.c.expires_at > now)).first()
        if row is None:
            return None
        m = row._mapping
        return StoredResponse(
            m["id"],
            m["app"],
            m["model"],
            m["previous_response_id"],
            m["created_at"],
            m["expires_at"],
            list(m["input_items"]),
            dict(m["response"]),
        )

    def delete(self, response_id: str, app: str | None) -> bool:
        """Delete the response ``response_id`` of ``app``; False when it has none of that id. Raises StoreError."""
        with self.db.begin() as conn:
            return bool(conn.execute(delete(responses).where(_mine(response_id, app))).rowcount)

    def purge(self, now: float) -> int:
        """Delete every response that expired by ``now``; how many. Raises StoreError."""
        with self.db.begin() as conn:
            return int(conn.execute(delete(responses).where(responses.c.expires_at <= now)).rowcount)


def _upsert(dialect: str) -> Insert:
    """An insert that replaces the row of the same id, in the database's own words."""
    module = postgresql if dialect == "postgresql" else sqlite
    statement = module.insert(responses)
    columns = {c.name: statement.excluded[c.name] for c in responses.columns if c.name != "id"}
    upsert: Insert = statement.on_conflict_do_update(index_elements=[responses.c.id], set_=columns)
    return upsert


def _mine(response_id: str, app: str | None) -> ColumnElement[bool]:
    owner = responses.c.app.is_(None) if app is None else responses.c.app == app
    return and_(responses.c.id == response_id, owner)
