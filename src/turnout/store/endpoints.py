"""External endpoints: servers Turnout routes to but never manages (a Mac's Ollama, LM Studio, a cloud API).

``update`` and ``remove`` take a ``check`` called with the current record inside the transaction (the
admin API's If-Match), and write only if the row is still the one checked (its ``updated_at``): a change
made meanwhile by another replica or the CLI raises :class:`~turnout.store.keys.StaleRecord`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from turnout.core.names import model_name_problem
from turnout.dialects.base import NATIVE_APIS
from turnout.store.bounds import MAX_LATENCY_BUDGET_MS, MAX_URL
from turnout.store.db import Database, StoreError
from turnout.store.keys import StaleRecord
from turnout.store.schema import endpoints

__all__ = [
    "API_TYPES",
    "MAX_LATENCY_BUDGET_MS",
    "EndpointExists",
    "EndpointRecord",
    "EndpointStore",
    "validate_endpoint",
]

Check = Callable[["EndpointRecord"], None]
T = TypeVar("T")


class EndpointExists(StoreError):
    """An endpoint of that name is registered already (the admin API answers 409)."""


API_TYPES = ("openai", "ollama")
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
    native_apis: str | None = None  # stored as "anthropic,responses"

    @property
    def native(self) -> list[str]:
        """The client APIs the endpoint serves itself (:data:`turnout.dialects.base.NATIVE_APIS`)."""
        return [] if not self.native_apis else self.native_apis.split(",")

    def to_json(self) -> dict[str, Any]:
        """Everything but the credential, which is only ever said to be set or not."""
        return {
            "name": self.name,
            "url": self.url,
            "api": self.api,
            "credential": self.credential is not None,
            "fallback_model": self.fallback_model,
            "latency_budget_ms": self.latency_budget_ms,
            "native_apis": self.native,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


def native_column(apis: Sequence[str] | None) -> str | None:
    """How a list of native APIs is stored (sorted, once each; None for none); refuses a name not in
    :data:`turnout.dialects.base.NATIVE_APIS`."""
    unknown = sorted(set(apis or ()) - set(NATIVE_APIS))
    if unknown:
        raise StoreError(f"native_apis: {unknown} unknown; the choices are {list(NATIVE_APIS)}")
    return ",".join(sorted(set(apis or ()))) or None


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
        native_apis: Sequence[str] | None = None,
    ) -> EndpointRecord:
        validate_endpoint(name, url, api, latency_budget_ms, fallback_model)
        native = native_column(native_apis)
        taken = f'an endpoint named "{name}" already exists; choose another name or change that one'
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
                        native_apis=native,
                        created_at=now,
                        updated_at=now,
                    )
                )
        except IntegrityError:
            raise EndpointExists(taken) from None
        except StoreError:
            if self.exists(name):
                raise EndpointExists(taken) from None
            raise
        return self.get(name)

    def exists(self, name: str) -> bool:
        with self.db.begin() as conn:
            return conn.execute(select(endpoints.c.id).where(endpoints.c.name == name)).first() is not None

    def update(
        self, name: str, changes: dict[str, Any], *, now: float, check: Check | None = None
    ) -> tuple[EndpointRecord, EndpointRecord]:
        for required in ("url", "api"):
            if required in changes and changes[required] is None:
                raise StoreError(f"the {required} of an endpoint cannot be removed")
        fields = ("url", "api", "credential", "fallback_model", "latency_budget_ms", "native_apis")
        values = {k: v for k, v in changes.items() if k in fields}
        if "url" in values:
            values["url"] = values["url"].rstrip("/")
        if "native_apis" in values:
            values["native_apis"] = native_column(values["native_apis"])
        with self.db.begin() as conn:
            before = self._get(conn, name)
            if check is not None:
                check(before)
            merged = {**before.to_json(), **changes}
            validate_endpoint(name, merged["url"], merged["api"], merged["latency_budget_ms"], merged["fallback_model"])
            done = conn.execute(
                update(endpoints)
                .where(endpoints.c.name == name, endpoints.c.updated_at == before.updated_at)
                .values(**values, updated_at=now)
            )
            if done.rowcount != 1:
                raise StaleRecord(f'endpoint "{name}" was changed by someone else meanwhile; reload it and retry')
            return before, self._get(conn, name)

    def remove(self, name: str, *, check: Check | None = None) -> EndpointRecord:
        return self.remove_and(name, check=check)[0]

    def remove_and(
        self, name: str, *, check: Check | None = None, then: Callable[[Connection], T] | None = None
    ) -> tuple[EndpointRecord, T | None]:
        """Remove the endpoint and run ``then`` (e.g. revoking its keys) in the same transaction: both
        happen or neither does. (record, what ``then`` returned)."""
        with self.db.begin() as conn:
            record = self._get(conn, name)
            if check is not None:
                check(record)
            done = conn.execute(
                delete(endpoints).where(endpoints.c.name == name, endpoints.c.updated_at == record.updated_at)
            )
            if done.rowcount != 1:
                raise StaleRecord(f'endpoint "{name}" was changed by someone else meanwhile; reload it and retry')
            return record, None if then is None else then(conn)

    def get(self, name: str) -> EndpointRecord:
        with self.db.begin() as conn:
            return self._get(conn, name)

    def _get(self, conn: Connection, name: str) -> EndpointRecord:
        row = conn.execute(select(endpoints).where(endpoints.c.name == name)).mappings().first()
        if row is None:
            raise KeyError(f'no endpoint "{name}" (see: turnout endpoint list)')
        return EndpointRecord(**dict(row))

    def all(self) -> list[EndpointRecord]:
        with self.db.begin() as conn:
            rows = conn.execute(select(endpoints).order_by(endpoints.c.name)).mappings().all()
        return [EndpointRecord(**dict(r)) for r in rows]
