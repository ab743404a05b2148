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

from sqlalchemy import ColumnElement, and_, delete, insert, select

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

    def put(self, record: StoredResponse) -> None:
        """Keep ``record`` (replacing one of the same id). Raises StoreError."""
        with self.db.begin() as conn:
            conn.execute(delete(responses).where(responses.c.id == record.id))
            conn.execute(
                insert(responses).values(
                    id=record.id,
                    app=record.app,
                    model=record.model,
                    previous_response_id=record.previous_response_id,
                    created_at=record.created_at,
                    expires_at=record.expires_at,
                    input_items=record.input_items,
                    response=record.response,
                )
            )

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


def _mine(response_id: str, app: str | None) -> ColumnElement[bool]:
    owner = responses.c.app.is_(None) if app is None else responses.c.app == app
    return and_(responses.c.id == response_id, owner)
