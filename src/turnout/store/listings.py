"""When the gateway first listed each model: the ``modified_at`` of a model whose server reports no time.

Kept in the store, so that every process of `turnout serve --workers N`, every replica on the same database
and the gateway after a restart give a model the same ``modified_at`` (clients such as Open WebUI compare it
to decide whether a model changed). The first process to list a model decides; the others read its time.
"""

from __future__ import annotations

from sqlalchemy import text

from turnout.store.db import Database

__all__ = ["ModelListings"]

_KEEP = text("INSERT INTO model_listings (name, first_listed) VALUES (:name, :at) ON CONFLICT (name) DO NOTHING")
_READ = text("SELECT first_listed FROM model_listings WHERE name = :name")
_ALL = text("SELECT name, first_listed FROM model_listings")


class ModelListings:
    def __init__(self, db: Database) -> None:
        self.db = db

    def all(self) -> dict[str, float]:
        """Every model's first listing (read at start-up). Raises StoreError."""
        with self.db.begin() as conn:
            return {name: float(at) for name, at in conn.execute(_ALL)}

    def keep(self, name: str, at: float) -> float:
        """Record ``at`` as when ``name`` was first listed, unless a time is recorded already; the recorded
        time either way. Raises StoreError."""
        with self.db.begin() as conn:
            conn.execute(_KEEP, {"name": name, "at": at})
            return float(conn.execute(_READ, {"name": name}).scalar_one())
