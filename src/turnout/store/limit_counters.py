"""Rate windows and daily token budgets counted in the SQL store, for the processes of one gateway.

`turnout serve --workers N` runs N processes on one machine; their limits must hold as if one process
counted. Each admission is one transaction that first locks the subject's budget row (an insert that
conflicts is still a write, which takes SQLite's write lock; PostgreSQL's ``SELECT ... FOR UPDATE`` locks the
row), then counts the subject's admissions of the last minute and decides with the same rule as one process
(:func:`turnout.core.limits.decide`). Used by ``turnout.gateway.store_limiter``; sync, called from threads.
"""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import Update, case, delete, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from turnout.core.limits import DAY_S, WINDOW_S, Decision, decide
from turnout.store.db import Database
from turnout.store.schema import limit_admissions, limit_budgets

__all__ = ["LimitCounters"]

_A, _B = limit_admissions, limit_budgets


class LimitCounters:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._upsert = postgresql.insert if db.dialect == "postgresql" else sqlite.insert

    def admit(
        self, subject: str, now: float, rpm: int | None, daily: int | None, estimate: int, member: str
    ) -> Decision:
        """Decide one admission and record it when allowed (raises StoreError)."""
        today = int(now // DAY_S)
        with self.db.begin() as conn:
            conn.execute(
                self._upsert(_B).values(subject=subject, day=today, used=0).on_conflict_do_nothing()
            )  # the subject's lock: every admission of this subject waits here for the one before
            day, used = conn.execute(select(_B.c.day, _B.c.used).where(_B.c.subject == subject).with_for_update()).one()
            if day != today:
                used = 0
            conn.execute(delete(_A).where(_A.c.subject == subject, _A.c.at <= now - WINDOW_S))
            count, oldest = conn.execute(select(func.count(), func.min(_A.c.at)).where(_A.c.subject == subject)).one()
            decision = decide(now, rpm, daily, estimate, in_window=int(count), oldest=oldest, used=int(used))
            if decision.allowed:
                conn.execute(insert(_A).values(member=member, subject=subject, at=now))
                if daily is not None:
                    used += estimate
            if decision.allowed or day != today:
                conn.execute(update(_B).where(_B.c.subject == subject).values(day=today, used=used))
        return replace(decision, member=member)

    def settle(self, subject: str, day: int, delta: int) -> None:
        """Add ``delta`` (negative: a refund) to the tokens of ``day``; never below zero, and a day that has
        passed is left alone (its budget is gone)."""
        if delta == 0:
            return
        with self.db.begin() as conn:
            conn.execute(_add_tokens(subject, day, delta))

    def release(self, subject: str, member: str, day: int, reserved: int) -> None:
        """Undo an admission entirely: its window entry and its reserved tokens."""
        with self.db.begin() as conn:
            conn.execute(delete(_A).where(_A.c.member == member))
            conn.execute(_add_tokens(subject, day, -reserved))


def _add_tokens(subject: str, day: int, delta: int) -> Update:
    total = _B.c.used + delta
    return update(_B).where(_B.c.subject == subject, _B.c.day == day).values(used=case((total < 0, 0), else_=total))
