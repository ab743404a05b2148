"""Usage rows and their summaries (per key, endpoint, worker; by hour or day)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import insert, select

from turnout.store.db import Database
from turnout.store.schema import keys, usage

__all__ = ["UsageRow", "UsageStore"]


@dataclass(frozen=True, slots=True)
class UsageRow:
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


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return round(sorted_values[index], 3)


class UsageStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def insert_many(self, rows: Sequence[UsageRow]) -> None:
        if rows:
            with self.db.begin() as conn:
                conn.execute(insert(usage), [asdict(r) for r in rows])

    def summary(
        self, *, since: float, key_id: int | None = None, bucket: str = "hour", limit_rows: int = 1_000_000
    ) -> list[dict[str, Any]]:
        """Groups of (bucket start, key, endpoint, worker, model) with counts, tokens and latency p50/p95."""
        width = 3600 if bucket == "hour" else 86_400
        query = (
            select(usage, keys.c.prefix)
            .select_from(usage.outerjoin(keys, usage.c.key_id == keys.c.id))
            .where(usage.c.ts >= since)
            .order_by(usage.c.ts)
            .limit(limit_rows)
        )
        if key_id is not None:
            query = query.where(usage.c.key_id == key_id)
        with self.db.begin() as conn:
            rows = conn.execute(query).mappings().all()
        groups: dict[tuple[Any, ...], dict[str, Any]] = {}
        latencies: dict[tuple[Any, ...], list[float]] = {}
        for r in rows:
            start = int(r["ts"] // width * width)
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
                },
            )
            g["requests"] += 1
            g["errors"] += int(bool(r["error"]))
            g["prompt_tokens"] += r["prompt_tokens"]
            g["completion_tokens"] += r["completion_tokens"]
            latencies.setdefault(group, []).append(r["latency_ms"])
        out = []
        for group, g in groups.items():
            values = sorted(latencies[group])
            out.append({**g, "latency_ms_p50": _percentile(values, 0.5), "latency_ms_p95": _percentile(values, 0.95)})
        return out
