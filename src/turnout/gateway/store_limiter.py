"""Admission against per-key limits counted in the SQL store: the limiter of `turnout serve --workers N`.

The processes of one gateway share the store, so the store counts (``turnout.store.limit_counters``, one
transaction per admission): exact across the processes, with no Redis. One process alone counts in memory
(:class:`turnout.gateway.limiter.LocalLimiter`); replicas on several machines use Redis.

With SQLite the processes' admissions take turns on a file lock. When it is free, the step (about 50 us)
runs right here on the event loop. A process's own steps take turns on an asyncio lock, so only the other
processes contend for the file lock; when one of them holds it, it is tried again after short pauses (0.1 to
5 ms, the loop serving other requests meanwhile), and only after those waited for in a thread. A hop to a
thread for every admission cost about 300 us of CPU per request (two processes, c=32), six times the step
itself. With an rpm-limited key over two processes (`python -m bench.workers`), this took non-stream requests
from 534 to 399 us of CPU each and streams from 665 to 549 (one process: about 175 and 325); what is left is
mostly SQLite's, each process re-reading the pages the other one changed. PostgreSQL queues its row locks
itself: there, every step runs in a thread.
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
        self._turn = asyncio.Lock()

    async def _run(self, step: Callable[..., T], *args: Any) -> T:
        counters = self._counters
        if not counters.file_locked:
            return await asyncio.to_thread(step, *args)  # PostgreSQL queues its row locks itself
        # This process's steps take turns here, on the loop, so that only the other processes contend for the
        # file lock (a step waiting for it in a thread held the thread lock too, and the next steps then failed
        # to take it and went to threads as well: under load most of them did).
        async with self._turn:
            for pause in (*_RETRY_PAUSES_S, None):
                if counters.try_lock():
                    try:
                        return step(*args, locked=True)
                    finally:
                        counters.unlock()
                if pause is None:
                    break
                await asyncio.sleep(pause)  # another process is in its step (about 50 us)
            return await asyncio.to_thread(step, *args)  # held that long: wait for it without holding the loop

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
