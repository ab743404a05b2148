"""Usage roll-ups on SQLite and a real PostgreSQL server: values at every column limit are kept, one row the
database refuses never blocks the others, an unreachable database keeps rows for retry, and summaries
report percentiles within [min, max] (also over rows written before 0004)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import text

import turnout.store
from tests.conftest import free_port
from turnout.core import latency
from turnout.gateway.accounting import UsageBatcher
from turnout.store.db import Database
from turnout.store.schema import usage
from turnout.store.usage import Rollup, UsageRow, UsageStore, fit, rollup

NOW = 1_800_000_000.0
INT32, INT64 = 2**31 - 1, 2**63 - 1


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    database.migrate()
    yield database
    database.close()


def row(model: str = "m", **kw: Any) -> UsageRow:
    values: dict[str, Any] = {
        "ts": NOW,
        "key_id": None,
        "endpoint": "openai:chat",
        "model": model,
        "worker": "w1",
        "status": 200,
        "error": False,
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "latency_ms": 12.0,
    }
    values.update(kw)
    return UsageRow(**values)


def stored(db: Database) -> list[dict[str, Any]]:
    with db.engine.connect() as conn:
        return [dict(r) for r in conn.execute(usage.select().order_by(usage.c.id)).mappings()]


def poison(db: Database) -> None:
    """Make the database refuse every roll-up of a model named "poison..." (no value fitting can avoid it)."""
    with db.engine.begin() as conn:
        if db.dialect == "sqlite":
            conn.execute(
                text(
                    "CREATE TRIGGER poison BEFORE INSERT ON usage_rollup WHEN NEW.model LIKE 'poison%'"
                    " BEGIN SELECT RAISE(ABORT, 'poisoned row'); END"
                )
            )
        else:
            conn.execute(text("ALTER TABLE usage_rollup ADD CONSTRAINT poison CHECK (model NOT LIKE 'poison%')"))


LONG = "x" * 5000
EDGE_ROWS = [
    row(model="m" * 256),  # exactly at the limit: kept as it is
    row(model="m" * 257),
    row(model=LONG, worker=LONG, endpoint=LONG, fallback_from=LONG),
    row(model="é" * 300),  # also 600 UTF-8 bytes
    row(model="模型" * 128),  # at the limit in characters, 768 UTF-8 bytes
    row(model="nul\x00inside", worker="w\x00"),  # PostgreSQL text cannot hold NUL
    row(model="lone \ud800 surrogate"),  # not encodable as UTF-8
    row(model="\n\r\t'\";--"),
    row(status=INT32),
    row(status=INT32 + 1),
    row(status=-(10**30)),
    row(key_id=INT32),
    row(prompt_tokens=INT64, completion_tokens=INT64 + 1),
    row(prompt_tokens=10**40, completion_tokens=-5),
    row(latency_ms=math.nan),
    row(latency_ms=-1.0, status=201),
    row(latency_ms=math.inf, status=202),
    row(latency_ms=1e308, status=203),
    row(ts=2.0**33),  # a minute past 2038 (BIGINT since 0004)
    row(fallback_from="f" * 320, model="fb"),
]


def test_values_at_and_beyond_every_column_limit_are_kept(db: Database) -> None:
    store = UsageStore(db)
    groups = rollup(EDGE_ROWS)
    result = store.insert_rollups(groups)
    assert result.refused == [] and result.unwritten == {}
    rows = stored(db)
    assert len(rows) == len(groups)
    for r in rows:
        for name in ("endpoint", "model", "worker", "fallback_from"):
            length = usage.c[name].type.length  # type: ignore[attr-defined]
            assert r[name] is None or len(r[name]) <= length, name
            assert r[name] is None or "\x00" not in r[name]
        assert -INT32 - 1 <= r["status"] <= INT32 and 0 <= r["prompt_tokens"] <= INT64
        for name in ("latency_ms_sum", "latency_ms_min", "latency_ms_max"):
            assert math.isfinite(r[name]) and r[name] >= 0, name
    models = {r["model"] for r in rows}
    assert "m" * 256 in models and "m" * 257 not in models and {"é" * 256, "模型" * 128} <= models
    assert "nul\ufffdinside" in models and "lone ? surrogate" in models and "\n\r\t'\";--" in models
    assert max(r["prompt_tokens"] for r in rows) == INT64 and max(r["completion_tokens"] for r in rows) == INT64
    assert {r["fallback_from"] for r in rows if r["model"] == "fb"} == {"f" * 320}
    assert int(2.0**33) // 60 * 60 in {r["minute"] for r in rows}
    summary = store.summary(since=0, bucket="day")
    assert sum(s["requests"] for s in summary) == len(EDGE_ROWS)
    json.dumps(summary, allow_nan=False)  # no NaN or infinity reaches the API


@pytest.mark.parametrize("bad", [[0], [24], [49], [0, 49], [3, 4, 5, 30]])
def test_refused_rows_do_not_block_the_batch(db: Database, bad: list[int]) -> None:
    poison(db)
    rows = [row(model="poison" if i in bad else f"m{i}", latency_ms=float(i)) for i in range(50)]
    result = UsageStore(db).insert_many(rows)
    assert [r.group[3] for r in result.refused] == ["poison"] and result.unwritten == {}
    assert result.refused[0].rollup.requests == len(bad)  # same group: one roll-up
    assert "poison" in result.refused[0].reason and "\n" not in result.refused[0].reason
    written = stored(db)
    assert sorted(r["model"] for r in written) == sorted(f"m{i}" for i in range(50) if i not in bad)


def test_distinct_refused_rows_are_each_reported(db: Database) -> None:
    poison(db)
    rows = [row(model="poison", status=s) for s in (200, 429, 500)] + [row(model=f"ok{i}") for i in range(7)]
    result = UsageStore(db).insert_many(rows)
    assert sorted(r.group[5] for r in result.refused) == [200, 429, 500]
    assert len(stored(db)) == 7


def test_unreachable_database_keeps_every_row_for_retry() -> None:
    down = Database(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none")
    try:
        groups = rollup([row(model=f"m{i}") for i in range(5)])
        result = UsageStore(down).insert_rollups(groups)
    finally:
        down.close()
    assert result.refused == [] and result.unwritten.keys() == groups.keys()
    assert result.error is not None and result.error.startswith("OperationalError")


async def test_batcher_logs_counts_and_drops_only_the_refused_row(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    poison(db)
    dropped: list[int] = []
    batcher = UsageBatcher(UsageStore(db))
    batcher.on_dropped = dropped.append
    for i in range(10):
        batcher.add(row(model="poison\nforged log line" if i == 3 else f"m{i}", key_id=i))
    with caplog.at_level(logging.ERROR, logger="turnout.accounting"):
        await batcher.flush()
    assert dropped == [1]
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "model='poison\\nforged log line'" in line and "key_id=3" in line and "requests=1" in line
    assert "\n" not in line and "poison" in line.rsplit(": ", 1)[-1]  # one line, ending in the reason
    assert len(stored(db)) == 9
    batcher.add(row(model="later"))
    await batcher.flush()  # the refused row is not retried, nothing blocks the next batch
    assert dropped == [1] and len(stored(db)) == 10


async def test_a_flush_returns_only_once_a_write_under_way_has_landed(db: Database) -> None:
    """A reader flushes before it reads (a key's last use): while the loop's write holds the rows, that flush waits
    for it, where it had found nothing left to write and returned before the rows were in the database."""
    store = UsageStore(db)
    entered, release = threading.Event(), threading.Event()
    insert = store.insert_rollups

    def slow_insert(groups: Any) -> Any:
        entered.set()
        assert release.wait(10)
        return insert(groups)

    store.insert_rollups = slow_insert  # type: ignore[method-assign]
    batcher = UsageBatcher(store)
    batcher.add(row(key_id=1))
    first = asyncio.create_task(batcher.flush())  # as the loop's would
    try:
        assert await asyncio.to_thread(entered.wait, 10)
        second = asyncio.create_task(batcher.flush())  # as a reader's would
        await asyncio.sleep(0.1)
        assert not second.done()
        release.set()
        await asyncio.wait_for(second, 10)
        assert store.last_used() == {1: NOW // 60 * 60}
    finally:
        release.set()
        await first


async def test_a_cancelled_flush_still_writes_its_rows(db: Database) -> None:
    """A flush cancelled while its rows wait for a thread (every worker thread busy: a batch run's flusher stopped
    at the run's end on a loaded machine) writes them all the same; the next flush returns once they landed. The
    thread's work was cancelled with the flush before it began, and the rows, already taken from the batcher, were
    lost (a completed batch lacked a line's usage row)."""
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(1)  # one worker thread, kept busy: the write waits in its queue
    loop.set_default_executor(executor)
    busy, release = threading.Event(), threading.Event()
    blocker = loop.run_in_executor(executor, lambda: (busy.set(), release.wait(10)))
    try:
        assert busy.wait(10)
        batcher = UsageBatcher(UsageStore(db))
        batcher.add(row(key_id=1))
        cancelled = asyncio.create_task(batcher.flush())
        await asyncio.sleep(0.1)  # its write waits for the busy thread
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        batcher.add(row(key_id=2))
        release.set()
        assert await asyncio.wait_for(batcher.flush(), 10)
        assert UsageStore(db).last_used() == {1: NOW // 60 * 60, 2: NOW // 60 * 60}
    finally:
        release.set()
        await blocker
        executor.shutdown(wait=False)


def test_a_row_refused_for_its_text_is_kept_as_ascii(db: Database) -> None:
    """The last resort, for a server that will not take the characters (SQL_ASCII counts bytes, LATIN1 lacks
    most of them): here a constraint refuses any non-ASCII model."""
    with db.engine.begin() as conn:
        if db.dialect == "sqlite":
            conn.execute(
                text(
                    "CREATE TRIGGER ascii BEFORE INSERT ON usage_rollup WHEN NEW.model GLOB '*[^ -~]*'"
                    " BEGIN SELECT RAISE(ABORT, 'not ascii'); END"
                )
            )
        else:
            conn.execute(text("ALTER TABLE usage_rollup ADD CONSTRAINT ascii CHECK (model ~ '^[ -~]*$')"))
    result = UsageStore(db).insert_many([row(model="modèle-模型"), row(model="plain")])
    assert result.refused == [] and sorted(r["model"] for r in stored(db)) == ["mod?le-??", "plain"]


def test_fit_leaves_fitting_values_alone() -> None:
    assert fit(usage.c.model, "qwen3:8b") == "qwen3:8b" and fit(usage.c.worker, None) is None
    assert fit(usage.c.status, 200) == 200 and fit(usage.c.latency_ms_max, 1.5) == 1.5
    assert fit(usage.c.latency_ms_max, math.nan) == 0.0 and fit(usage.c.latency_ms_max, -math.inf) == -1e300
    assert fit(usage.c.latency_buckets, {"3": 1}) == {"3": 1}


@pytest.mark.parametrize(
    "samples", [[51, 52, 59], [59], [10, 12, 14, 16, 900], [0.2, 0.3, 4000, 4100], [1.0] * 20 + [30000.0]]
)
def test_summary_percentiles_lie_within_min_and_max(db: Database, samples: list[float]) -> None:
    store = UsageStore(db)
    half = len(samples) // 2
    store.insert_many([row(latency_ms=ms, ts=NOW + i) for i, ms in enumerate(samples[:half])])
    store.insert_many([row(latency_ms=ms, ts=NOW + 61 + i) for i, ms in enumerate(samples[half:])])  # 2nd minute
    [s] = store.summary(since=NOW - 3600, bucket="day")
    assert s["latency_ms_min"] == round(min(samples), 3) and s["latency_ms_max"] == round(max(samples), 3)
    for q in ("latency_ms_p50", "latency_ms_p95"):
        assert s["latency_ms_min"] <= s[q] <= s["latency_ms_max"], q
    ordered = sorted(samples)
    exact = ordered[math.ceil(0.5 * len(ordered)) - 1]
    assert abs(s["latency_ms_p50"] - exact) <= max(0.1, exact / 10) + 1e-3
    assert s["statuses"] == {"200": len(samples)}


def _legacy_buckets(samples: list[float]) -> list[int]:
    counts = [0] * (len(latency.LEGACY_BOUNDS_MS) + 1)
    for ms in samples:
        counts[latency.bucket_of(ms, latency.LEGACY_BOUNDS_MS)] += 1
    return counts


def _upgrade(db: Database, revision: str) -> None:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(Path(turnout.store.__file__).parent / "migrations"))
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def test_rows_from_before_0004_still_summarise_within_min_max(database_url: str) -> None:
    db = Database(database_url)
    try:
        _upgrade(db, "0003")
        legacy = [51.0, 52.0, 59.0]  # the bug report's shape: all inside the coarse (50, 100] bucket
        with db.engine.begin() as conn:
            insert = (
                "INSERT INTO usage_rollup (minute, key_id, endpoint, model, worker, status, fallback_from, requests,"
                " errors, prompt_tokens, completion_tokens, latency_ms_sum, latency_ms_max, latency_buckets)"
                " VALUES (:minute, NULL, 'openai:chat', :model, 'w1', 200, NULL, :n, 0, 1, 1, :sum, :max, :buckets)"
            )
            conn.execute(
                text(insert),
                [
                    {
                        "minute": int(NOW // 60 * 60),
                        "model": "old",
                        "n": 3,
                        "sum": sum(legacy),
                        "max": 59.0,
                        "buckets": json.dumps(_legacy_buckets(legacy)),
                    },
                    {
                        "minute": int(NOW // 60 * 60),
                        "model": "mixed",
                        "n": 1,
                        "sum": 70.0,
                        "max": 70.0,
                        "buckets": json.dumps(_legacy_buckets([70.0])),
                    },
                    {
                        "minute": int(NOW // 60 * 60),
                        "model": "carried",
                        "n": 1,
                        "sum": 9.0,
                        "max": 9.0,
                        "buckets": "[]",
                    },
                ],
            )
        db.migrate()
        store = UsageStore(db)
        store.insert_many([row(model="mixed", latency_ms=ms) for ms in (65.0, 80.0)])
        by_model = {s["model"]: s for s in store.summary(since=NOW - 60)}
        old = by_model["old"]
        assert old["latency_ms_min"] is None and old["latency_ms_max"] == 59.0  # min unknown for 3 requests
        assert 50 < old["latency_ms_p50"] <= 59 and 50 < old["latency_ms_p95"] <= 59
        mixed = by_model["mixed"]  # a one-request legacy row knows its min; merged at coarse resolution
        assert mixed["requests"] == 3 and mixed["latency_ms_min"] == 65.0 and mixed["latency_ms_max"] == 80.0
        assert 65.0 <= mixed["latency_ms_p50"] <= 80.0 and mixed["latency_ms_p95"] == 80.0
        carried = by_model["carried"]  # carried over from before roll-ups: no histogram
        assert carried["latency_ms_p50"] is None and carried["latency_ms_max"] == 9.0
    finally:
        db.close()


def test_rollup_absorb_keeps_min_and_max() -> None:
    a, b = Rollup(), Rollup()
    a.add(row(latency_ms=5.0))
    b.add(row(latency_ms=2.0))
    b.add(row(latency_ms=9.0))
    a.absorb(b)
    assert (a.requests, a.latency_ms_min, a.latency_ms_max, sum(a.buckets.values())) == (3, 2.0, 9.0, 3)
    empty = Rollup()
    empty.absorb(Rollup())
    assert empty.latency_ms_min is None
