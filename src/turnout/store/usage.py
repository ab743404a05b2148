"""Usage: requests rolled up per minute and group in memory, written in batches, summarised on read.

A group is (minute, key, endpoint, model, worker, status, fallback origin). Each roll-up keeps counts,
token sums and a latency histogram (:mod:`turnout.core.latency`), so p50/p95 can be computed for any
bucket width later.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import insert, select

from turnout.core import latency
from turnout.store.db import Database
from turnout.store.schema import keys, usage

__all__ = ["Rollup", "UsageRow", "UsageStore", "rollup"]


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One finished client request."""

    ts: float
    key_id: int | None
    endpoint: str
    model: str
    worker: str | None
    status: int
    error: bool
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    fallback_from: str | None = None

    @property
    def group(self) -> tuple[Any, ...]:
        return (
            int(self.ts // 60 * 60),
            self.key_id,
            self.endpoint,
            self.model,
            self.worker,
            self.status,
            self.fallback_from,
        )


@dataclass(slots=True)
class Rollup:
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms_sum: float = 0.0
    latency_ms_max: float = 0.0
    buckets: list[int] = field(default_factory=latency.empty)

    def add(self, row: UsageRow) -> None:
        self.requests += 1
        self.errors += int(row.error)
        self.prompt_tokens += row.prompt_tokens
        self.completion_tokens += row.completion_tokens
        self.latency_ms_sum += row.latency_ms
        self.latency_ms_max = max(self.latency_ms_max, row.latency_ms)
        self.buckets[latency.bucket_of(row.latency_ms)] += 1

    def absorb(self, other: Rollup) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.latency_ms_sum += other.latency_ms_sum
        self.latency_ms_max = max(self.latency_ms_max, other.latency_ms_max)
        latency.merge(self.buckets, other.buckets)


def rollup(rows: Iterable[UsageRow]) -> dict[tuple[Any, ...], Rollup]:
    groups: dict[tuple[Any, ...], Rollup] = {}
    for row in rows:
        groups.setdefault(row.group, Rollup()).add(row)
    return groups


_GROUP_COLUMNS = ("minute", "key_id", "endpoint", "model", "worker", "status", "fallback_from")


class UsageStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def insert_rollups(self, groups: dict[tuple[Any, ...], Rollup]) -> None:
        if not groups:
            return
        values = [
            {
                **dict(zip(_GROUP_COLUMNS, group, strict=True)),
                "requests": r.requests,
                "errors": r.errors,
                "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.completion_tokens,
                "latency_ms_sum": r.latency_ms_sum,
                "latency_ms_max": r.latency_ms_max,
                "latency_buckets": r.buckets,
            }
            for group, r in groups.items()
        ]
        with self.db.begin() as conn:
            conn.execute(insert(usage), values)

    def insert_many(self, rows: Iterable[UsageRow]) -> None:
        self.insert_rollups(rollup(rows))

    def summary(self, *, since: float, key_id: int | None = None, bucket: str = "hour") -> list[dict[str, Any]]:
        """Per (bucket start, key, endpoint, worker, model, fallback origin): counts, tokens, latency p50/p95."""
        width = 3600 if bucket == "hour" else 86_400
        query = (
            select(usage, keys.c.prefix)
            .select_from(usage.outerjoin(keys, usage.c.key_id == keys.c.id))
            .where(usage.c.minute >= int(since // 60 * 60))
            .order_by(usage.c.minute)
        )
        if key_id is not None:
            query = query.where(usage.c.key_id == key_id)
        with self.db.begin() as conn:
            rows = conn.execute(query).mappings().all()
        groups: dict[tuple[Any, ...], dict[str, Any]] = {}
        for r in rows:
            start = r["minute"] // width * width
            group = (start, r["prefix"], r["endpoint"], r["worker"], r["model"], r["fallback_from"])
            g = groups.setdefault(
                group,
                {
                    "bucket_start": start,
                    "key": r["prefix"],
                    "endpoint": r["endpoint"],
                    "worker": r["worker"],
                    "model": r["model"],
                    "fallback_from": r["fallback_from"],
                    "requests": 0,
                    "errors": 0,
                    "prompt_tokens": 0,
                    "completion_tokens": 0,
                    "_buckets": latency.empty(),
                    "_max": 0.0,
                },
            )
            g["requests"] += r["requests"]
            g["errors"] += r["errors"]
            g["prompt_tokens"] += r["prompt_tokens"]
            g["completion_tokens"] += r["completion_tokens"]
            latency.merge(g["_buckets"], r["latency_buckets"] or [])
            g["_max"] = max(g["_max"], r["latency_ms_max"])
        out = []
        for g in groups.values():
            buckets, peak = g.pop("_buckets"), g.pop("_max")
            out.append(
                {
                    **g,
                    "latency_ms_p50": latency.percentile(buckets, 0.5, peak),
                    "latency_ms_p95": latency.percentile(buckets, 0.95, peak),
                    "latency_ms_max": round(peak, 3),
                }
            )
        return out
