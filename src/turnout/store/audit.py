"""The audit log: append-only records of who changed what, when, with before/after; credentials masked.

Read newest first, filtered by time range, action, actor (exact, or a prefix ending in ``*``: ``cli:*``) and
target prefix (``key:tk_ab``, ``worker:a``); :meth:`AuditLog.facets` lists the actions and actors present
(for filter menus).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, insert, select

from turnout.masking import redact
from turnout.store.bounds import MAX_AUDIT_ENTRIES
from turnout.store.db import Database, StoreError
from turnout.store.schema import audit

__all__ = ["MAX_ENTRIES", "AuditLog", "AuditRecord"]

MAX_ENTRIES = MAX_AUDIT_ENTRIES  # the most entries one query returns


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _masked(value: Any) -> Any:
    """``value`` (text or JSON) with every credential in it masked (:func:`turnout.masking.redact`)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {_masked(k): _masked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class AuditRecord:
    id: int
    ts: float
    actor: str
    action: str
    target: str
    before: Any
    after: Any
    detail: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "ts": self.ts,
            "actor": self.actor,
            "action": self.action,
            "target": self.target,
            "before": self.before,
            "after": self.after,
            "detail": self.detail,
        }


class AuditLog:
    """Only ``record`` writes; nothing updates or deletes rows."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def record(
        self,
        *,
        actor: str,
        action: str,
        target: str,
        now: float,
        before: Any = None,
        after: Any = None,
        detail: str | None = None,
    ) -> None:
        # The change is already made when it is audited: clip texts to their columns rather than lose the entry.
        # No credential is ever written: a key, token or endpoint credential a caller passes in is masked here.
        with self.db.begin() as conn:
            conn.execute(
                insert(audit).values(
                    ts=now,
                    actor=_fit(redact(actor), 128),
                    action=_fit(action, 64),
                    target=_fit(redact(target), 256),
                    before=_masked(before),
                    after=_masked(after),
                    detail=None if detail is None else redact(detail),
                )
            )

    def entries(
        self,
        *,
        since: float | None = None,
        action: str | None = None,
        limit: int = 100,
        until: float | None = None,
        actor: str | None = None,
        target: str | None = None,
    ) -> list[AuditRecord]:
        query = select(audit).order_by(audit.c.id.desc()).limit(max(1, min(limit, MAX_ENTRIES)))
        for name, value in (("since", since), ("until", until)):
            if value is not None and not math.isfinite(value):
                raise StoreError(f"{name} must be a finite time")
        if since is not None:
            query = query.where(audit.c.ts >= since)
        if until is not None:
            query = query.where(audit.c.ts < until)
        if action is not None:
            query = query.where(audit.c.action == action)
        if actor is not None:
            query = (
                _match(query, audit.c.actor, actor[:-1], prefix=True)
                if actor.endswith("*")
                else (query.where(audit.c.actor == actor))
            )
        if target is not None:
            query = _match(query, audit.c.target, target, prefix=True)
        with self.db.begin() as conn:
            rows = conn.execute(query).mappings().all()
        return [AuditRecord(**dict(r)) for r in rows]

    def facets(self) -> dict[str, list[str]]:
        """The distinct actions and actors in the log, sorted."""
        with self.db.begin() as conn:
            actions = conn.execute(select(audit.c.action).distinct()).scalars().all()
            actors = conn.execute(select(audit.c.actor).distinct()).scalars().all()
        return {"actions": sorted(actions), "actors": sorted(actors)}


def _match(query: Select[Any], column: Any, text: str, *, prefix: bool) -> Select[Any]:
    """``column`` starts with ``text`` (LIKE with its wildcards escaped)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return query.where(column.like(escaped + ("%" if prefix else ""), escape="\\"))
