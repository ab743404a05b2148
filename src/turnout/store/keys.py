"""Tenants, apps and their API keys. Only a SHA-256 of each key is stored; the key is shown once.

Key format: ``tk_`` + 43 URL-safe characters (256 random bits). A key is referred to by its id or its
display prefix (the first 10 characters) in the CLI and admin API.

Every key has a computed state (:meth:`KeyRecord.state`): ``active``, ``revoked``, ``expired``, or
``in_grace`` (rotated, still working until its ``expires_at``). Changes that may race another writer
(``update``, ``revoke``, ``rotate``) lock the row (``SELECT ... FOR UPDATE`` where the database has it)
and call the caller's ``check`` with the current record first (the admin API's If-Match).
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, CursorResult, Insert, RowMapping, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from turnout.core.admission import Priority
from turnout.core.patterns import Pattern, parse_pattern
from turnout.core.priority import key_class, tenant_default
from turnout.store.bounds import MAX_INT, MAX_NAME
from turnout.store.db import Database, StoreError
from turnout.store.schema import apps, keys, tenants

__all__ = [
    "KEY_PREFIX",
    "KEY_STATES",
    "MAX_INT",
    "MAX_NAME",
    "KeyRecord",
    "KeyRevoked",
    "KeyStore",
    "StaleRecord",
    "UnknownTenant",
    "hash_key",
    "parse_scopes",
]

KEY_STATES = ("active", "revoked", "expired", "in_grace")
UNSET: Any = object()  # "not given" for update(); None means "remove the limit"


class KeyRevoked(StoreError):
    """A revoked key cannot be changed (the admin API answers 409)."""


class StaleRecord(StoreError):
    """A guarded write found the row changed by another writer since it was checked (the API answers 412)."""


class UnknownTenant(KeyError):
    """No tenant by that name (the API answers 404)."""


KEY_PREFIX = "tk_"
DEFAULT_TENANT = "default"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_scopes(items: list[str] | None) -> list[str]:
    """``model:<pattern>`` or bare patterns -> validated patterns; none given means every model."""
    if not items:
        return ["*"]
    out = []
    for raw in items:
        text = raw.strip().removeprefix("model:")
        parse_pattern(text)  # PatternError (a ValueError) names the problem
        out.append(text)
    return out


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: int
    prefix: str
    app: str
    tenant: str
    tenant_id: int
    tenant_max_concurrent: int | None
    tenant_weight: int
    scopes: tuple[Pattern, ...]
    rpm: int | None
    daily_tokens: int | None
    expires_at: float | None
    revoked_at: float | None
    lineage: int
    created_at: float
    rotated_to: int | None = None
    priority: Priority | None = None  # the key's own class (None: its tenant's default)
    tenant_priority: Priority | None = None  # the tenant's default class as the store has it

    def priority_class(self, configured: Priority | None) -> Priority:
        """The class of the key's requests before any header: its own, else its tenant's default (``configured``,
        config.json's ``tenants.<t>.priority``, before the store's), else standard."""
        return key_class(self.priority, tenant_default(configured, self.tenant_priority))

    def state(self, now: float) -> str:
        """``revoked``, ``expired``, ``in_grace`` (rotated; works until ``expires_at``) or ``active``."""
        if self.revoked_at is not None and self.revoked_at <= now:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        if self.rotated_to is not None:
            return "in_grace"
        return "active"

    def reaches_endpoint(self, name: str) -> bool:
        """Whether some scope can match a model of endpoint ``name`` (``<name>/<model>``; ``*`` reaches all)."""
        space = f"{name}/"
        return any(
            p.prefix.startswith(space) if p.exact else (p.prefix.startswith(space) or space.startswith(p.prefix))
            for p in self.scopes
        )

    def usable(self, now: float) -> str | None:
        """None when the key may be used at ``now``, else why not."""
        if self.revoked_at is not None and self.revoked_at <= now:
            return "this API key was revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "this API key has expired"
        return None

    def allows(self, model: str) -> bool:
        return any(p.matches(model) for p in self.scopes)

    def stored_json(self) -> dict[str, Any]:
        """The stored fields only (what the ETag covers: the same for every reader at any time)."""
        return {
            "id": self.id,
            "prefix": self.prefix,
            "app": self.app,
            "tenant": self.tenant,
            "models": [f"model:{p.text}" for p in self.scopes],
            "rpm": self.rpm,
            "daily_tokens": self.daily_tokens,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
            "rotated_to": self.rotated_to,
            "created_at": self.created_at,
            "priority": None if self.priority is None else self.priority.value,
        }

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """Stored fields plus the computed ``state`` at ``now`` (default: the current time) and
        ``grace_until`` (the time a rotated key stops working; None unless in grace)."""
        state = self.state(time.time() if now is None else now)
        return {**self.stored_json(), "state": state, "grace_until": self.expires_at if state == "in_grace" else None}


Check = Callable[[KeyRecord], None]


class KeyStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def create(
        self,
        *,
        app: str,
        tenant: str | None,
        scopes: list[str],
        rpm: int | None,
        daily_tokens: int | None,
        expires_at: float | None,
        now: float,
        priority: Priority | None = None,
    ) -> tuple[KeyRecord, str]:
        """A new key for ``app`` (created, with its tenant, when missing); returns (record, plaintext).
        ``priority``: its class (None: its tenant's default)."""
        for name, value in (("rpm", rpm), ("daily_tokens", daily_tokens)):
            if value is not None and value < 1:
                raise StoreError(f"{name} must be at least 1, got {value}")
            if value is not None and value > MAX_INT:
                raise StoreError(f"{name} must be at most {MAX_INT}, got {value}")
        if expires_at is not None and not math.isfinite(expires_at):
            raise StoreError("expires_at must be a finite time")
        with self.db.begin() as conn:
            app_id = self._app_id(conn, app, tenant, now)
            plaintext, key_id = self._insert(
                conn, app_id, scopes, rpm, daily_tokens, expires_at, None, now, _class_text(priority)
            )
            record = self._load(conn, key_id)
        return record, plaintext

    def rotate(
        self, ref: str, *, grace_s: float, now: float, check: Check | None = None
    ) -> tuple[KeyRecord, KeyRecord, str]:
        """(old, new, plaintext): the new key copies scopes, limits and class; the old one works for ``grace_s``."""
        if not (math.isfinite(grace_s) and grace_s >= 0):
            raise StoreError("grace_s must be a finite number of seconds >= 0")
        with self.db.begin() as conn:
            old = self._resolve(conn, ref, lock=True)
            if check is not None:
                check(old)
            if old.usable(now) is not None:
                raise StoreError(f"key {old.prefix} cannot be rotated: {old.usable(now)}")
            row = conn.execute(select(keys).where(keys.c.id == old.id)).mappings().one()
            plaintext, new_id = self._insert(
                conn,
                row["app_id"],
                row["models"],
                row["rpm"],
                row["daily_tokens"],
                row["expires_at"],
                old.lineage,
                now,
                row["priority"],
            )
            until = now + grace_s
            if old.expires_at is not None:
                until = min(until, old.expires_at)
            conn.execute(update(keys).where(keys.c.id == old.id).values(expires_at=until, rotated_to=new_id))
            return self._load(conn, old.id), self._load(conn, new_id), plaintext

    def revoke(self, ref: str, *, now: float, check: Check | None = None) -> tuple[KeyRecord, KeyRecord]:
        """(before, after). A key revoked already raises :class:`KeyRevoked` (nothing is written, so
        nothing new is audited)."""
        with self.db.begin() as conn:
            before = self._resolve(conn, ref, lock=True)
            if check is not None:
                check(before)
            if before.revoked_at is not None:
                when = datetime.fromtimestamp(before.revoked_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
                raise KeyRevoked(f"key {before.prefix} was already revoked at {when}; nothing changed")
            conn.execute(update(keys).where(keys.c.id == before.id).values(revoked_at=now))
            return before, self._load(conn, before.id)

    def update(
        self,
        ref: str,
        *,
        now: float,
        scopes: list[str] = UNSET,
        rpm: int | None = UNSET,
        daily_tokens: int | None = UNSET,
        expires_at: float | None = UNSET,
        priority: Priority | None = UNSET,
        check: Check | None = None,
    ) -> tuple[KeyRecord, KeyRecord]:
        """Change a key's scopes, limits and class (only the arguments given; None removes a limit or the expiry,
        or the key's own class: its tenant's default applies). (before, after). A revoked key cannot be changed."""
        values: dict[str, Any] = {}
        if scopes is not UNSET:
            values["models"] = parse_scopes(scopes)
        for name, value in (("rpm", rpm), ("daily_tokens", daily_tokens)):
            if value is UNSET:
                continue
            if value is not None and not 1 <= value <= MAX_INT:
                raise StoreError(f"{name} must be from 1 to {MAX_INT}, got {value}")
            values[name] = value
        if expires_at is not UNSET:
            if expires_at is not None and not math.isfinite(expires_at):
                raise StoreError("expires_at must be a finite time")
            values["expires_at"] = expires_at
        if priority is not UNSET:
            values["priority"] = _class_text(priority)
        with self.db.begin() as conn:
            before = self._resolve(conn, ref, lock=True)
            if check is not None:
                check(before)
            if before.state(now) == "revoked":
                raise KeyRevoked(f"key {before.prefix} is revoked and cannot be changed; create a new key")
            if values:
                conn.execute(update(keys).where(keys.c.id == before.id).values(**values))
            return before, self._load(conn, before.id)

    def revoke_endpoint_keys(
        self, endpoint: str, *, now: float, conn: Connection | None = None
    ) -> list[tuple[KeyRecord, KeyRecord]]:
        """Revoke the keys registration printed for ``endpoint`` (app ``endpoint-<name>``, scope ``<name>/*``,
        and their rotations); (before, after) for each key that was not revoked yet. ``conn``: run inside
        that transaction (removing the endpoint in the same one)."""
        if conn is None:
            with self.db.begin() as own:
                return self.revoke_endpoint_keys(endpoint, now=now, conn=own)
        out = []
        for record in self._records(conn, apps.c.name == f"endpoint-{endpoint}"):
            if record.revoked_at is None and [p.text for p in record.scopes] == [f"{endpoint}/*"]:
                conn.execute(update(keys).where(keys.c.id == record.id).values(revoked_at=now))
                out.append((record, self._load(conn, record.id)))
        return out

    def get(self, ref: str) -> KeyRecord:
        with self.db.begin() as conn:
            return self._resolve(conn, ref)

    def all(self) -> list[KeyRecord]:
        with self.db.begin() as conn:
            return self._records(conn, None)

    def tenants(self) -> list[dict[str, Any]]:
        """Every tenant with its fair-share settings and how many apps and keys it has."""
        with self.db.begin() as conn:
            rows = conn.execute(select(tenants).order_by(tenants.c.name)).mappings().all()
            app_counts: dict[int, int] = dict(
                conn.execute(select(apps.c.tenant_id, func.count()).group_by(apps.c.tenant_id)).all()
            )
            key_counts: dict[int, int] = dict(
                conn.execute(
                    select(apps.c.tenant_id, func.count())
                    .select_from(keys.join(apps, keys.c.app_id == apps.c.id))
                    .group_by(apps.c.tenant_id)
                ).all()
            )
        return [
            {
                "name": r["name"],
                "max_concurrent": r["max_concurrent"],
                "weight": r["weight"] or 1,
                "priority": _class_text(_stored_class(r["priority"])),
                "created_at": r["created_at"],
                "apps": int(app_counts.get(r["id"], 0)),
                "keys": int(key_counts.get(r["id"], 0)),
            }
            for r in rows
        ]

    def apps(self) -> list[dict[str, Any]]:
        """Every app with its tenant and how many keys it has."""
        with self.db.begin() as conn:
            rows = conn.execute(
                select(apps.c.id, apps.c.name, apps.c.created_at, tenants.c.name.label("tenant"))
                .join(tenants, apps.c.tenant_id == tenants.c.id)
                .order_by(apps.c.name)
            ).all()
            counts: dict[int, int] = dict(
                conn.execute(select(keys.c.app_id, func.count()).group_by(keys.c.app_id)).all()
            )
        return [
            {"name": r.name, "tenant": r.tenant, "created_at": r.created_at, "keys": int(counts.get(r.id, 0))}
            for r in rows
        ]

    def find(self, plaintext: str) -> KeyRecord | None:
        """The record of a presented key, or None. Constant work whatever the key looks like."""
        digest = hash_key(plaintext)
        with self.db.begin() as conn:
            key_id = conn.execute(select(keys.c.id).where(keys.c.hash == digest)).scalar()
            return None if key_id is None else self._load(conn, key_id)

    def tenant_priority(self, name: str) -> Priority | None:
        """A tenant's default class as the store has it (None: none, or no such tenant)."""
        with self.db.begin() as conn:
            return _stored_class(conn.execute(select(tenants.c.priority).where(tenants.c.name == name)).scalar())

    def set_tenant_priority(
        self, name: str, priority: Priority | None, *, check: Callable[[Priority | None], None] | None = None
    ) -> tuple[Priority | None, Priority | None]:
        """Set (None: remove) a tenant's default class; (before, after). :class:`UnknownTenant` for a name no app
        was created under. ``check`` is called with the current value, the row locked."""
        with self.db.begin() as conn:
            query = select(tenants.c.id, tenants.c.priority).where(tenants.c.name == name)
            row = conn.execute(query.with_for_update()).first()
            if row is None:
                raise UnknownTenant(f'no tenant "{name[:MAX_NAME]}" (a tenant is made with its first app\'s key)')
            before = _stored_class(row.priority)
            if check is not None:
                check(before)
            conn.execute(update(tenants).where(tenants.c.id == row.id).values(priority=_class_text(priority)))
        return before, priority

    def ensure_tenant(self, name: str, *, max_concurrent: int | None, weight: int, now: float) -> None:
        with self.db.begin() as conn:
            tenant_id = self._tenant_id(conn, name, now)
            conn.execute(
                update(tenants).where(tenants.c.id == tenant_id).values(max_concurrent=max_concurrent, weight=weight)
            )

    def count(self) -> int:
        with self.db.begin() as conn:
            return int(conn.execute(select(func.count()).select_from(keys)).scalar_one())

    # -- internals -------------------------------------------------------------------------------
    def _tenant_id(self, conn: Connection, name: str, now: float) -> int:
        if not name or len(name) > MAX_NAME:
            raise StoreError(f"tenant name must be 1 to {MAX_NAME} characters")
        found = conn.execute(select(tenants.c.id).where(tenants.c.name == name)).scalar()
        if found is not None:
            return int(found)
        made = _insert_once(conn, insert(tenants).values(name=name, created_at=now))
        return (
            made
            if made is not None
            else int(conn.execute(select(tenants.c.id).where(tenants.c.name == name)).scalar_one())
        )

    def _app_id(self, conn: Connection, app: str, tenant: str | None, now: float) -> int:
        if not app or len(app) > MAX_NAME:
            raise StoreError(f"app name must be 1 to {MAX_NAME} characters")
        row = conn.execute(
            select(apps.c.id, tenants.c.name).join(tenants, apps.c.tenant_id == tenants.c.id).where(apps.c.name == app)
        ).first()
        if row is not None:
            if tenant is not None and row[1] != tenant:
                raise StoreError(f'app "{app}" belongs to tenant "{row[1]}", not "{tenant}"')
            return int(row[0])
        tenant_id = self._tenant_id(conn, tenant or DEFAULT_TENANT, now)
        made = _insert_once(conn, insert(apps).values(name=app, tenant_id=tenant_id, created_at=now))
        return made if made is not None else self._app_id(conn, app, tenant, now)

    def _insert(
        self,
        conn: Connection,
        app_id: int,
        scopes: list[str],
        rpm: int | None,
        daily_tokens: int | None,
        expires_at: float | None,
        lineage: int | None,
        now: float,
        priority: str | None = None,
    ) -> tuple[str, int]:
        plaintext = KEY_PREFIX + secrets.token_urlsafe(32)
        result = conn.execute(
            insert(keys).values(
                app_id=app_id,
                prefix=plaintext[:10],
                hash=hash_key(plaintext),
                models=scopes,
                rpm=rpm,
                daily_tokens=daily_tokens,
                expires_at=expires_at,
                lineage=lineage,
                created_at=now,
                priority=priority,
            )
        )
        return plaintext, _new_id(result)

    def _resolve(self, conn: Connection, ref: str, *, lock: bool = False) -> KeyRecord:
        ref = ref.strip()
        plaintext = ref.startswith(KEY_PREFIX) and len(ref) > 10
        shown = f"{ref[:10]}..." if plaintext else ref[:64]  # never echo a whole key
        query = select(keys.c.id)
        if ref.isascii() and ref.isdigit():
            if len(ref) > 10 or int(ref) > MAX_INT:  # no such id; also keeps the number within the column
                raise KeyError(f'no key "{shown}" (use the id or the prefix shown by `turnout key list`)')
            query = query.where(keys.c.id == int(ref))
        elif plaintext:
            query = query.where(keys.c.hash == hash_key(ref))
        else:
            query = query.where(keys.c.prefix == ref)
        found = conn.execute(query.with_for_update() if lock else query).scalars().all()
        if not found:
            raise KeyError(f'no key "{shown}" (use the id or the prefix shown by `turnout key list`)')
        if len(found) > 1:
            raise KeyError(f'"{shown}" matches {len(found)} keys; use the id')
        return self._load(conn, found[0])

    def _load(self, conn: Connection, key_id: int) -> KeyRecord:
        found = self._records(conn, keys.c.id == key_id)
        if not found:
            raise KeyError(f"no key with id {key_id}")
        return found[0]

    def _records(self, conn: Connection, where: ColumnElement[bool] | None) -> list[KeyRecord]:
        """Records of the keys ``where`` selects (it may filter on keys, apps and tenants), by id."""
        query = (
            select(
                keys,
                apps.c.name.label("app"),
                tenants.c.name.label("tenant"),
                tenants.c.id.label("tenant_id"),
                tenants.c.max_concurrent.label("tmax"),
                tenants.c.weight.label("tweight"),
                tenants.c.priority.label("tpriority"),
            )
            .join(apps, keys.c.app_id == apps.c.id)
            .join(tenants, apps.c.tenant_id == tenants.c.id)
            .order_by(keys.c.id)
        )
        if where is not None:
            query = query.where(where)
        return [_record(row) for row in conn.execute(query).mappings().all()]


def _record(row: RowMapping) -> KeyRecord:
    return KeyRecord(
        id=row["id"],
        prefix=row["prefix"],
        app=row["app"],
        tenant=row["tenant"],
        tenant_id=row["tenant_id"],
        tenant_max_concurrent=row["tmax"],
        tenant_weight=row["tweight"] or 1,
        scopes=tuple(parse_pattern(p) for p in row["models"]),
        rpm=row["rpm"],
        daily_tokens=row["daily_tokens"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
        lineage=row["lineage"] or row["id"],
        created_at=row["created_at"],
        rotated_to=row["rotated_to"],
        priority=_stored_class(row["priority"]),
        tenant_priority=_stored_class(row["tpriority"]),
    )


def _insert_once(conn: Connection, statement: Insert) -> int | None:
    """Insert a row another writer may be inserting at the same moment (two replicas starting on a new store each
    make the first app's tenant): its id, or None when the other writer's row came first (read it then). On
    PostgreSQL the insert is a savepoint, so the loser's transaction goes on; SQLite has one writer at a time."""
    if conn.dialect.name != "postgresql":
        return _new_id(conn.execute(statement))
    try:
        with conn.begin_nested():
            return _new_id(conn.execute(statement))
    except IntegrityError:
        return None


def _class_text(priority: Priority | None) -> str | None:
    return None if priority is None else priority.value


def _stored_class(value: str | None) -> Priority | None:
    """A stored class; a value no release writes (a hand-edited row) counts as not set."""
    try:
        return None if value is None else Priority(value)
    except ValueError:
        return None


def _new_id(result: CursorResult[Any]) -> int:
    pk = result.inserted_primary_key
    assert pk is not None
    return int(pk[0])
