"""Limits counted in the store (turnout.store.limit_counters): exact when several processes admit at once.

Each "process" is its own Database (its own engine and connections) on the same SQLite file or PostgreSQL
database, as the processes of `turnout serve --workers N` are; threads admit concurrently.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from turnout.core.limits import DAY_S
from turnout.store.db import Database
from turnout.store.limit_counters import LimitCounters


@pytest.fixture
def counters(database_url: str, tmp_path: Path) -> Iterator[list[LimitCounters]]:
    first = Database(database_url)
    first.migrate()
    second = Database(database_url)
    # SQLite: admissions queue on an flock of one file, as the gateway's processes do (PostgreSQL: row locks)
    lock = tmp_path / "limits.lock" if first.dialect == "sqlite" else None
    made = [LimitCounters(first, lock), LimitCounters(second, lock)]
    try:
        yield made
    finally:
        for counter in made:
            counter.close()
        first.close()
        second.close()


def _admit_many(
    counters: list[LimitCounters], n: int, *, rpm: int | None, daily: int | None, estimate: int, now: float
) -> list[bool]:
    def one(i: int) -> bool:
        d = counters[i % 2].admit("k1", now + i * 1e-6, rpm, daily, estimate, uuid.uuid4().hex)
        return d.allowed

    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(one, range(n)))


def test_rpm_is_exact_across_two_handles(counters: list[LimitCounters]) -> None:
    allowed = _admit_many(counters, 120, rpm=50, daily=None, estimate=10, now=time.time())
    assert allowed.count(True) == 50


def test_daily_tokens_are_exact_across_two_handles(counters: list[LimitCounters]) -> None:
    allowed = _admit_many(counters, 120, rpm=None, daily=1000, estimate=30, now=time.time())
    assert allowed.count(True) == 33  # 33 * 30 = 990; one more would pass 1000


def test_window_slides_and_refusal_says_when(counters: list[LimitCounters]) -> None:
    a, b = counters
    now = 1_000_000.0
    assert a.admit("k1", now, 2, None, 1, "m1").allowed
    assert b.admit("k1", now + 10, 2, None, 1, "m2").allowed
    refused = a.admit("k1", now + 20, 2, None, 1, "m3")
    assert not refused.allowed and refused.retry_after == 40 and "2 requests per minute" in refused.reason
    assert b.admit("k1", now + 60.5, 2, None, 1, "m4").allowed  # the first admission has left the window
    assert a.admit("k2", now + 20, 2, None, 1, "m5").allowed  # subjects count apart


def test_settle_release_and_a_new_day(counters: list[LimitCounters]) -> None:
    a, b = counters
    now = 5 * DAY_S + 100
    first = a.admit("k1", now, None, 100, 60, "m1")
    assert first.allowed and first.tokens_remaining == 40
    assert not b.admit("k1", now + 1, None, 100, 60, "m2").allowed
    b.settle("k1", first.day, 10 - 60)  # the request used 10 of its 60
    second = b.admit("k1", now + 2, None, 100, 60, "m3")
    assert second.allowed and second.tokens_remaining == 30
    a.release("k1", "m3", second.day, 60)
    assert a.admit("k1", now + 3, None, 100, 90, "m4").tokens_remaining == 0
    a.settle("k1", first.day - 1, -1000)  # yesterday's settlement leaves today alone
    assert not a.admit("k1", now + 4, None, 100, 1, "m5").allowed
    tomorrow = b.admit("k1", 6 * DAY_S + 1, None, 100, 100, "m6")
    assert tomorrow.allowed and tomorrow.tokens_remaining == 0


def test_release_takes_the_request_out_of_the_window(counters: list[LimitCounters]) -> None:
    a, b = counters
    now = 2_000_000.0
    d = a.admit("k1", now, 1, None, 1, "m1")
    assert not b.admit("k1", now + 1, 1, None, 1, "m2").allowed
    b.release("k1", "m1", d.day, 0)
    assert a.admit("k1", now + 2, 1, None, 1, "m3").allowed
