"""Admission against per-key limits counted in the SQL store: the limiter of `turnout serve --workers N`.

The processes of one gateway share the store, so the store counts (``turnout.store.limit_counters``, one
transaction per admission): exact across the processes, with no Redis. One process alone counts in memory
(:class:`turnout.gateway.limiter.LocalLimiter`); replicas on several machines use Redis.

With SQLite the processes' admissions take turns on a file lock. When it is free, the step (about 50 us)
runs right here on the event loop; when another process holds it, the lock is tried again after short pauses
(0.1 to 5 ms, the loop serving other requests meanwhile), and only then waited for in a thread. A hop to a
thread for every admission cost about 300 us of CPU per request (two processes, c=32), six times the step
itself; with the pauses, streams with an rpm-limited key over two processes went from 665 to 507 us of CPU
per request (`python -m bench.workers`), non-stream stayed about 520 us: the transaction itself dominates.
PostgreSQL queues its row locks itself: there, every step runs in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from turnout.core.limits import Decision
from turnout.errors import Unavailable
from turnout.gateway.limiter import Subject, refusal
from turnout.store.db import Database, StoreError
from turnout.store.limit_counters import LimitCounters

__all__ = ["StoreLimiter"]

T = TypeVar("T")

# Pauses between tries of the lock while another process holds it, before waiting for it in a thread: a
# try and a pause cost a few us of CPU, a thread hop about 300 us.
_RETRY_PAUSES_S = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005)


class StoreLimiter:
    def __init__(self, database: Database, lock_file: Path | None = None) -> None:
        self._counters = LimitCounters(database, lock_file)

    async def _run(self, step: Callable[..., T], *args: Any) -> T:
        counters = self._counters
        if counters.file_locked:
            for pause in (*_RETRY_PAUSES_S, None):
                if counters.try_lock():
                    try:
                        return step(*args, locked=True)
                    finally:
                        counters.unlock()
                if pause is None:
                    break
                await asyncio.sleep(pause)  # another process is in its step (about 50 us): serve others meanwhile
        return await asyncio.to_thread(step, *args)  # PostgreSQL queues its row locks itself

    async def admit(self, subject: Subject, estimate: int) -> Decision:
        try:
            decision = await self._run(
                self._counters.admit,
                subject.id,
                time.time(),
                subject.rpm,
                subject.daily_tokens,
                estimate,
                uuid.uuid4().hex,
            )
        except StoreError as exc:
            raise Unavailable(f"limit store unavailable: {exc}", code="limits_unavailable", retry_after=5) from None
        if not decision.allowed:
            raise refusal(decision, subject.label)
        return decision

    async def settle(self, subject: Subject, decision: Decision, reserved: int, actual: int) -> None:
        if subject.daily_tokens is None or actual == reserved:
            return
        # A lost settlement only errs on the strict side: the reservation stays counted.
        with contextlib.suppress(StoreError):
            await self._run(self._counters.settle, subject.id, decision.day, actual - reserved)

    async def release(self, subject: Subject, decision: Decision, reserved: int) -> None:
        with contextlib.suppress(StoreError):
            await self._run(
                self._counters.release,
                subject.id,
                decision.member,
                decision.day,
                reserved if subject.daily_tokens is not None else 0,
            )

    async def close(self) -> None:
        self._counters.close()
