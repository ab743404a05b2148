"""Rate windows and daily token budgets counted in the SQL store, for the processes of one gateway.

`turnout serve --workers N` runs N processes on one machine; their limits must hold as if one process
counted. Each admission is one transaction that first locks the subject's budget row (an insert that
conflicts is still a write, which takes SQLite's write lock; PostgreSQL's ``SELECT ... FOR UPDATE`` locks the
row), then counts the subject's admissions of the last minute and decides with the same rule as one process
(:func:`turnout.core.limits.decide`). Used by ``turnout.gateway.store_limiter``; sync, called from threads.

The statements are plain SQL run on the driver's cursor of a pooled connection: built with SQLAlchemy's
expression language they cost about 1.4 ms of CPU per admission (nearly all of it building and caching the
statements), through ``exec_driver_sql`` about 130 us, on the cursor about 50 us (one process, SQLite).
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from turnout.core.limits import DAY_S, WINDOW_S, Decision, decide
from turnout.store.db import Database, StoreError

__all__ = ["LimitCounters"]

# Tables: turnout.store.schema.limit_budgets and limit_admissions. "?" is turned into the driver's marker.
_LOCK = "INSERT INTO limit_budgets (subject, day, used, in_window) VALUES (?, ?, 0, 0) ON CONFLICT (subject) DO NOTHING"
_BUDGET = "SELECT day, used, in_window FROM limit_budgets WHERE subject = ?"
_EXPIRE = "DELETE FROM limit_admissions WHERE subject = ? AND at <= ?"
_OLDEST = "SELECT min(at) FROM limit_admissions WHERE subject = ?"
_ADMIT = "INSERT INTO limit_admissions (member, subject, at) VALUES (?, ?, ?)"
_STORE = "UPDATE limit_budgets SET day = ?, used = ?, in_window = ? WHERE subject = ?"
_ADD = "UPDATE limit_budgets SET used = CASE WHEN used + ? < 0 THEN 0 ELSE used + ? END WHERE subject = ? AND day = ?"
_FORGET = "DELETE FROM limit_admissions WHERE member = ?"
_SHRINK = "UPDATE limit_budgets SET in_window = in_window - 1 WHERE subject = ?"


class LimitCounters:
    """``lock_file`` (SQLite): admissions of every process queue on an ``flock`` of this file (and a thread lock
    within each process) before their transaction. SQLite's own wait for its write lock polls with sleeps of
    up to 100 ms, which under load cost more CPU and latency than the admissions; the kernel wakes the next
    waiter of an flock at once. PostgreSQL queues its row locks itself."""

    def __init__(self, db: Database, lock_file: Path | None = None) -> None:
        self.db = db
        self._mutex = threading.Lock()
        self._lock_fd = None if lock_file is None else os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        postgres = db.dialect == "postgresql"

        def sql(text: str) -> str:
            return text.replace("?", "%s") if postgres else text

        self._lock, self._expire, self._oldest, self._admit, self._store, self._add, self._forget, self._shrink = (
            sql(t) for t in (_LOCK, _EXPIRE, _OLDEST, _ADMIT, _STORE, _ADD, _FORGET, _SHRINK)
        )
        # SQLite's write lock is taken by _LOCK itself; PostgreSQL's row lock by FOR UPDATE
        self._budget = sql(_BUDGET + (" FOR UPDATE" if postgres else ""))

    @property
    def file_locked(self) -> bool:
        """Whether admissions queue on the lock file (SQLite), so that :meth:`try_lock` can take it."""
        return self._lock_fd is not None

    def try_lock(self) -> bool:
        """Take the lock without waiting (then pass ``locked=True`` and call :meth:`unlock`); False when another
        thread or process holds it. Without a lock file there is nothing to take: False."""
        if self._lock_fd is None or not self._mutex.acquire(blocking=False):
            return False
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._mutex.release()
            return False
        return True

    def unlock(self) -> None:
        assert self._lock_fd is not None
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        self._mutex.release()

    @contextmanager
    def _transaction(self, locked: bool) -> Iterator[Any]:
        """A DB-API cursor in a transaction on a pooled connection; driver errors become StoreError.
        ``locked``: the caller holds the lock already (:meth:`try_lock`)."""
        if self._lock_fd is None or locked:
            with self._cursor() as cursor:
                yield cursor
            return
        with self._mutex:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                with self._cursor() as cursor:
                    yield cursor
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    @contextmanager
    def _cursor(self) -> Iterator[Any]:
        try:
            with self.db.engine.connect() as conn:
                raw = conn.connection.dbapi_connection
                assert raw is not None
                cursor = raw.cursor()
                try:
                    yield cursor
                    raw.commit()
                except BaseException:
                    raw.rollback()
                    raise
                finally:
                    cursor.close()
        except StoreError:
            raise
        except Exception as exc:  # sqlite3.Error, psycopg.Error, SQLAlchemy's pool errors: the store failed
            raise StoreError(
                f"limit counters: {exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from None

    def admit(
        self,
        subject: str,
        now: float,
        rpm: int | None,
        daily: int | None,
        estimate: int,
        member: str,
        *,
        locked: bool = False,
    ) -> Decision:
        """Decide one admission and record it when allowed (raises StoreError)."""
        today = int(now // DAY_S)
        with self._transaction(locked) as cur:
            cur.execute(self._lock, (subject, today))  # the subject's lock: each admission waits here for the last
            cur.execute(self._budget, (subject,))
            day, used, count = cur.fetchone()
            if day != today:
                used = 0
            # the row keeps the window's count: expired entries leave by an index range, nothing is counted
            cur.execute(self._expire, (subject, now - WINDOW_S))
            count -= max(cur.rowcount, 0)
            cur.execute(self._oldest, (subject,))
            oldest = cur.fetchone()[0]
            decision = decide(now, rpm, daily, estimate, in_window=max(count, 0), oldest=oldest, used=int(used))
            if decision.allowed:
                cur.execute(self._admit, (member, subject, now))
                count += 1
                if daily is not None:
                    used += estimate
            cur.execute(self._store, (today, used, count, subject))
        return replace(decision, member=member)

    def settle(self, subject: str, day: int, delta: int, *, locked: bool = False) -> None:
        """Add ``delta`` (negative: a refund) to the tokens of ``day``; never below zero, and a day that has
        passed is left alone (its budget is gone)."""
        if delta == 0:
            return
        with self._transaction(locked) as cur:
            cur.execute(self._add, (delta, delta, subject, day))

    def release(self, subject: str, member: str, day: int, reserved: int, *, locked: bool = False) -> None:
        """Undo an admission entirely: its window entry and its reserved tokens."""
        with self._transaction(locked) as cur:
            cur.execute(self._forget, (member,))
            if cur.rowcount > 0:
                cur.execute(self._shrink, (subject,))
            if reserved:
                cur.execute(self._add, (-reserved, -reserved, subject, day))

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
