"""External endpoints: servers Turnout routes to but never manages (a Mac's Ollama, LM Studio, a cloud API)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from turnout.core.names import model_name_problem
from turnout.store.db import Database, StoreError
from turnout.store.schema import endpoints

__all__ = ["API_TYPES", "MAX_LATENCY_BUDGET_MS", "EndpointRecord", "EndpointStore", "validate_endpoint"]

API_TYPES = ("openai", "ollama")
MAX_URL = 2048  # the column's width
MAX_LATENCY_BUDGET_MS = 600_000  # 10 minutes; the admin inputs document the same cap
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)


@dataclass(frozen=True, slots=True)
class EndpointRecord:
    id: int
    name: str
    url: str
    api: str
    credential: str | None  # encrypted
    fallback_model: str | None
    latency_budget_ms: int | None
    created_at: float
    updated_at: float

    def to_json(self) -> dict[str, Any]:
        """Everything but the credential, which is only ever said to be set or not."""
        return {
            "name": self.name,
            "url": self.url,
            "api": self.api,
            "credential": self.credential is not None,
            "fallback_model": self.fallback_model,
            "latency_budget_ms": self.latency_budget_ms,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


def validate_endpoint(
    name: str, url: str, api: str, latency_budget_ms: int | None, fallback_model: str | None = None
) -> None:
    """The store's own guard (callers validate with turnout.admin.inputs first): what the columns can hold."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise StoreError(f"endpoint name {name!r}: use letters, digits, '.', '_', '-' (at most 64)")
    if not isinstance(url, str) or len(url) > MAX_URL or not re.fullmatch(r"https?://[^/\s]+(/\S*)?", url):
        raise StoreError("endpoint url: must start with http:// or https://, name a host, and have no spaces")
    if api not in API_TYPES:
        raise StoreError(f"api must be 'openai' or 'ollama', got {api!r}")
    if latency_budget_ms is not None and (
        isinstance(latency_budget_ms, bool)
        or not isinstance(latency_budget_ms, int)
        or not 1 <= latency_budget_ms <= MAX_LATENCY_BUDGET_MS
    ):
        raise StoreError(f"latency_budget_ms must be an integer from 1 to {MAX_LATENCY_BUDGET_MS}")
    if fallback_model is not None:
        problem = model_name_problem(fallback_model, "fallback_model")
        if problem is not None:
            raise StoreError(problem)


class EndpointStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(
        self,
        *,
        name: str,
        url: str,
        api: str,
        credential: str | None,
        fallback_model: str | None,
        latency_budget_ms: int | None,
        now: float,
    ) -> EndpointRecord:
        validate_endpoint(name, url, api, latency_budget_ms, fallback_model)
        try:
            with self.db.engine.begin() as conn:
                conn.execute(
                    insert(endpoints).values(
                        name=name,
                        url=url.rstrip("/"),
                        api=api,
                        credential=credential,
                        fallback_model=fallback_model,
                        latency_budget_ms=latency_budget_ms,
                        created_at=now,
                        updated_at=now,
                    )
                )
        except IntegrityError:
            raise StoreError(f'an endpoint named "{name}" already exists') from None
        return self.get(name)

    def update(self, name: str, changes: dict[str, Any], *, now: float) -> tuple[EndpointRecord, EndpointRecord]:
        before = self.get(name)
        for required in ("url", "api"):
            if required in changes and changes[required] is None:
                raise StoreError(f"the {required} of an endpoint cannot be removed")
        merged = {**before.to_json(), **changes}
        validate_endpoint(name, merged["url"], merged["api"], merged["latency_budget_ms"], merged["fallback_model"])
        values = {
            k: v for k, v in changes.items() if k in ("url", "api", "credential", "fallback_model", "latency_budget_ms")
        }
        if "url" in values:
            values["url"] = values["url"].rstrip("/")
        with self.db.begin() as conn:
            conn.execute(update(endpoints).where(endpoints.c.name == name).values(**values, updated_at=now))
        return before, self.get(name)

    def remove(self, name: str) -> EndpointRecord:
        record = self.get(name)
        with self.db.begin() as conn:
            conn.execute(delete(endpoints).where(endpoints.c.name == name))
        return record

    def get(self, name: str) -> EndpointRecord:
        with self.db.begin() as conn:
            row = conn.execute(select(endpoints).where(endpoints.c.name == name)).mappings().first()
        if row is None:
            raise KeyError(f'no endpoint "{name}" (see: turnout endpoint list)')
        return EndpointRecord(**dict(row))

    def all(self) -> list[EndpointRecord]:
        with self.db.begin() as conn:
            rows = conn.execute(select(endpoints).order_by(endpoints.c.name)).mappings().all()
        return [EndpointRecord(**dict(r)) for r in rows]
