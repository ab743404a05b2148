"""Usage: requests rolled up per minute and group in memory, written in batches, summarised on read.

Used by the gateway's usage batcher (:mod:`turnout.gateway.accounting`), the admin usage API and
``turnout usage``.

A group is (minute, key, endpoint, model, worker, status, fallback origin, alias, batch): ``model`` is the model that
was served, ``alias`` the alias the request named for it (None when it named the model), ``batch`` the Batch API
batch whose line the request was (None for a client's own request). Each roll-up keeps counts,
token sums, latency min, max and sum, and a latency histogram (:mod:`turnout.core.latency`), so percentiles
can be computed for any bucket width later.

Writing never lets one row block the others: values are first fitted to their columns (text cut to the
column's length, integers clamped to the column's range, latencies made finite), and a batch the database
refuses is split in halves down to single rows; a row refused alone is tried once more with its text made
ASCII, and one refused even so is reported back as :class:`Refused` while every other row is written.
Only a database that cannot be reached leaves rows unwritten (:attr:`WriteResult.unwritten`), to be
retried.

Reading: :meth:`UsageStore.summary` (per bucket and group), :meth:`UsageStore.series` (one point per
bucket, empty buckets included, for charts), both filtered by :class:`UsageFilter`; ``last_used`` (the
latest minute with a request, per key: derived here so the request path never writes a key row) and
``fallback_counts`` (requests sent to a fallback, per endpoint they fell back from).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import BigInteger, Column, Float, Integer, Select, String, case, func, insert, or_, select
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from turnout.core import latency
from turnout.store.db import Database
from turnout.store.schema import keys, usage

__all__ = [
    "BUCKETS",
    "MAX_POINTS",
    "SERIES_COLUMNS",
    "SUMMARY_COLUMNS",
    "Refused",
    "Rollup",
    "UsageFilter",
    "UsageRow",
    "UsageStore",
    "WriteResult",
    "fit",
    "rollup",
    "to_csv",
]

Group = tuple[Any, ...]
BUCKETS = {"minute": 60, "hour": 3600, "day": 86_400}
MAX_POINTS = 5000  # buckets in one series


@dataclass(frozen=True, slots=True)
class UsageFilter:
    """Which usage rows to read. ``endpoint``: rows of an external endpoint, served by it (worker column)
    or sent to a fallback from it (``fallback_from`` = ``<endpoint>/<model>``); ``route``: the client API
    route column (``openai:chat``); the others match their column exactly."""

    key_id: int | None = None
    endpoint: str | None = None
    worker: str | None = None
    model: str | None = None
    route: str | None = None
    key_ids: tuple[int, ...] | None = None  # only these keys' rows (a team-admin's tenant); None: no such filter
    batch: str | None = None  # only the rows of this Batch API batch's lines

    def apply(self, query: Select[Any]) -> Select[Any]:
        if self.key_ids is not None:
            query = query.where(usage.c.key_id.in_(self.key_ids))
        if self.key_id is not None:
            query = query.where(usage.c.key_id == self.key_id)
        if self.endpoint is not None:
            like = self.endpoint.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "/%"
            query = query.where(or_(usage.c.worker == self.endpoint, usage.c.fallback_from.like(like, escape="\\")))
        if self.worker is not None:
            query = query.where(usage.c.worker == self.worker)
        if self.model is not None:
            query = query.where(usage.c.model == self.model)
        if self.route is not None:
            query = query.where(usage.c.endpoint == self.route)
        if self.batch is not None:
            query = query.where(usage.c.batch_id == self.batch)
        return query


class UsageRow(NamedTuple):
    """One finished client request (a named tuple: one is made per request, and a frozen dataclass costs
    several times as much to make)."""

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
    alias: str | None = None  # the alias the client named (``model`` is what it stands for)
    batch_id: str | None = None  # the Batch API batch whose line this request was

    @property
    def group(self) -> Group:
        return (
            int(self.ts // 60 * 60),
            self.key_id,
            self.endpoint,
            self.model,
            self.worker,
            self.status,
            self.fallback_from,
            self.alias,
            self.batch_id,
        )


@dataclass(slots=True)
class Rollup:
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms_sum: float = 0.0
    latency_ms_min: float | None = None
    latency_ms_max: float = 0.0
    buckets: dict[int, int] = field(default_factory=dict)  # sparse counts per latency.BOUNDS_MS bucket

    def add(self, row: UsageRow) -> None:
        ms = latency.clamp_ms(row.latency_ms)
        self.requests += 1
        self.errors += int(row.error)
        self.prompt_tokens += max(0, row.prompt_tokens)
        self.completion_tokens += max(0, row.completion_tokens)
        self.latency_ms_sum += ms
        self.latency_ms_min = ms if self.latency_ms_min is None else min(self.latency_ms_min, ms)
        self.latency_ms_max = max(self.latency_ms_max, ms)
        latency.add(self.buckets, ms)

    def absorb(self, other: Rollup) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.latency_ms_sum += other.latency_ms_sum
        if other.latency_ms_min is not None:
            mins = [m for m in (self.latency_ms_min, other.latency_ms_min) if m is not None]
            self.latency_ms_min = min(mins)
        self.latency_ms_max = max(self.latency_ms_max, other.latency_ms_max)
        latency.merge(self.buckets, other.buckets)


def rollup(rows: Iterable[UsageRow]) -> dict[Group, Rollup]:
    groups: dict[Group, Rollup] = {}
    for row in rows:
        groups.setdefault(row.group, Rollup()).add(row)
    return groups


@dataclass(frozen=True, slots=True)
class Refused:
    """A roll-up the database refused even on its own; ``reason`` is the first line of its error."""

    group: Group
    rollup: Rollup
    reason: str

    def describe(self) -> str:
        """One log line naming the row (text repr-escaped and shortened; no values beyond the group)."""
        minute, key_id, endpoint, model, worker, status, fallback_from, alias, batch_id = self.group
        return (
            f"minute={minute} key_id={key_id} endpoint={_short(endpoint)} model={_short(model)} "
            f"worker={_short(worker)} status={status} fallback_from={_short(fallback_from)} alias={_short(alias)} "
            f"batch={_short(batch_id)} requests={self.rollup.requests}: {self.reason}"
        )


@dataclass(slots=True)
class WriteResult:
    refused: list[Refused] = field(default_factory=list)  # dropped: the database will not take them
    unwritten: dict[Group, Rollup] = field(default_factory=dict)  # the database was unavailable: retry these
    error: str | None = None  # why ``unwritten`` is not empty


@dataclass(frozen=True, slots=True)
class _Item:
    group: Group
    rollup: Rollup
    values: dict[str, Any]
    strict: bool = False  # already fitted ASCII-only


_GROUP_COLUMNS = ("minute", "key_id", "endpoint", "model", "worker", "status", "fallback_from", "alias", "batch_id")
_INT32 = 2**31 - 1
_INT64 = 2**63 - 1
_FLOAT_MAX = 1e300  # finite on every backend; NaN is not storable everywhere (SQLite reads it as NULL)


def fit(column: Column[Any], value: Any, *, ascii_only: bool = False) -> Any:
    """``value`` made acceptable to ``column`` wherever that keeps its meaning: text without NUL characters or
    lone surrogates, cut to the column's length, integers clamped to the column's range, floats made finite.
    Anything else is returned as it is. ``ascii_only`` (the last resort for a row refused even so) also replaces
    every non-ASCII character, so the text fits the column under any server encoding (PostgreSQL's
    SQL_ASCII counts bytes, not characters)."""
    if value is None:
        return None
    kind = column.type
    if isinstance(kind, String) and isinstance(value, str):
        text = value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
        if ascii_only:
            text = text.encode("ascii", "replace").decode("ascii")
        return text[: kind.length] if kind.length else text
    if isinstance(kind, Integer) and isinstance(value, int) and not isinstance(value, bool):
        top = _INT64 if isinstance(kind, BigInteger) else _INT32
        return min(max(value, -top - 1), top)
    if isinstance(kind, Float) and isinstance(value, float | int) and not isinstance(value, bool):
        number = float(value)
        return 0.0 if math.isnan(number) else min(max(number, -_FLOAT_MAX), _FLOAT_MAX)
    return value


def _values(group: Group, r: Rollup, *, ascii_only: bool = False) -> dict[str, Any]:
    raw: dict[str, Any] = {
        **dict(zip(_GROUP_COLUMNS, group, strict=True)),
        "requests": r.requests,
        "errors": r.errors,
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "latency_ms_sum": r.latency_ms_sum,
        "latency_ms_min": r.latency_ms_min,
        "latency_ms_max": r.latency_ms_max,
        "latency_buckets": {str(i): c for i, c in sorted(r.buckets.items())},
    }
    return {name: fit(usage.c[name], value, ascii_only=ascii_only) for name, value in raw.items()}


def _unavailable(exc: BaseException) -> bool:
    """The database could not be reached or is busy (retry later), as opposed to refusing the rows."""
    return isinstance(exc, OperationalError | InterfaceError | DisconnectionError | PoolTimeout) or bool(
        getattr(exc, "connection_invalidated", False)
    )


def _reason(exc: BaseException) -> str:
    lines = str(exc).splitlines()  # SQLAlchemy puts the statement and its parameters on later lines
    return f"{exc.__class__.__name__}: {lines[0] if lines else ''}"[:300]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class UsageStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def insert_rollups(self, groups: Mapping[Group, Rollup]) -> WriteResult:
        """Write every roll-up the database accepts (see the module docstring). Never raises for a bad row."""
        result = WriteResult()
        pending: list[_Item] = []
        for group, r in groups.items():
            try:
                pending.append(_Item(group, r, _values(group, r)))
            except Exception as exc:  # a value no column can hold: drop this row, not the batch
                result.refused.append(Refused(group, r, _reason(exc)))
        parts = [pending] if pending else []
        while parts:
            part = parts.pop()
            error = self._write([item.values for item in part])
            if error is None:
                continue
            if _unavailable(error):
                for item in [*part, *(item for rest in parts for item in rest)]:
                    result.unwritten[item.group] = item.rollup
                result.error = _reason(error)
                break
            if len(part) > 1:
                half = len(part) // 2
                parts += [part[half:], part[:half]]  # the first half is tried first
                continue
            item = part[0]
            strict = None if item.strict else _values(item.group, item.rollup, ascii_only=True)
            if strict is not None and strict != item.values:
                parts.append([_Item(item.group, item.rollup, strict, strict=True)])
            else:
                result.refused.append(Refused(item.group, item.rollup, _reason(error)))
        return result

    def _write(self, values: list[dict[str, Any]]) -> Exception | None:
        try:
            with self.db.engine.begin() as conn:
                conn.execute(insert(usage), values)
        except Exception as exc:  # classified by the caller: unavailable (retry) or refused (split)
            return exc
        return None

    def insert_many(self, rows: Iterable[UsageRow]) -> WriteResult:
        return self.insert_rollups(rollup(rows))

    def _rows(self, since: float, until: float | None, where: UsageFilter) -> list[Any]:
        query = (
            select(usage, keys.c.prefix)
            .select_from(usage.outerjoin(keys, usage.c.key_id == keys.c.id))
            .where(usage.c.minute >= int(since // 60 * 60))
            .order_by(usage.c.minute)
        )
        if until is not None:
            query = query.where(usage.c.minute < until)
        with self.db.begin() as conn:
            return list(conn.execute(where.apply(query)).mappings().all())

    def summary(
        self,
        *,
        since: float,
        key_id: int | None = None,
        bucket: str = "hour",
        where: UsageFilter | None = None,
        until: float | None = None,
    ) -> list[dict[str, Any]]:
        """Per (bucket start, key, endpoint, worker, model, fallback origin, alias): counts (also per status), tokens,
        latency min, p50, p95 and max. Percentiles lie within [min, max] (see ``latency.percentile`` for their
        error bound); they are None when no request of the group carries a histogram (rows carried over from
        before roll-ups), and min is None when some roll-up does not know its minimum (written before 0004)."""
        width = BUCKETS[bucket]
        where = where or UsageFilter(key_id=key_id)
        groups: dict[Group, dict[str, Any]] = {}
        for r in self._rows(since, until, where):
            start = r["minute"] // width * width
            group = (start, r["prefix"], r["endpoint"], r["worker"], r["model"], r["fallback_from"], r["alias"])
            g = groups.get(group)
            if g is None:
                g = groups[group] = {
                    "bucket_start": start,
                    "key": r["prefix"],
                    "endpoint": r["endpoint"],
                    "worker": r["worker"],
                    "model": r["model"],
                    "fallback_from": r["fallback_from"],
                    "alias": r["alias"],
                    **_empty(),
                }
            _add(g, r)
        return [_finish(g) for g in groups.values()]

    def series(
        self, *, since: float, until: float, bucket: str = "hour", where: UsageFilter | None = None
    ) -> list[dict[str, Any]]:
        """One point per bucket from ``since`` to ``until`` (empty buckets as zeros, so a chart has no gaps):
        requests, errors, tokens, latency min, p50, p95 and max over every row ``where`` selects."""
        width = BUCKETS[bucket]
        first, last = int(since // width * width), int(until // width * width)
        if (last - first) // width + 1 > MAX_POINTS:
            raise ValueError(f"more than {MAX_POINTS} {bucket} buckets; choose a wider bucket or a later since")
        points = {start: {"bucket_start": start, **_empty()} for start in range(first, last + 1, width)}
        for r in self._rows(since, until, where or UsageFilter()):
            point = points.get(r["minute"] // width * width)
            if point is not None:
                _add(point, r)
        out = []
        for point in points.values():
            done = _finish(point)
            done.pop("statuses")
            out.append(done)
        return out

    def last_used(self) -> dict[int, float]:
        """Per key id, the start of the latest minute it made a request in (what has been flushed)."""
        query = select(usage.c.key_id, func.max(usage.c.minute)).where(usage.c.key_id.is_not(None))
        with self.db.begin() as conn:
            rows = conn.execute(query.group_by(usage.c.key_id)).all()
        return {int(k): float(m) for k, m in rows}

    def fallback_counts(self, *, since: float) -> dict[str, dict[str, int]]:
        """Per endpoint requests fell back from: ``{"total": n, "since": m}`` (``since``: a recent window)."""
        recent = func.sum(case((usage.c.minute >= int(since // 60 * 60), usage.c.requests), else_=0))
        query = (
            select(usage.c.fallback_from, func.sum(usage.c.requests), recent)
            .where(usage.c.fallback_from.is_not(None))
            .group_by(usage.c.fallback_from)
        )
        with self.db.begin() as conn:
            rows = conn.execute(query).all()
        out: dict[str, dict[str, int]] = {}
        for origin, total, window in rows:
            entry = out.setdefault(str(origin).split("/", 1)[0], {"total": 0, "since": 0})
            entry["total"] += int(total or 0)
            entry["since"] += int(window or 0)
        return out


def _empty() -> dict[str, Any]:
    return {
        "requests": 0,
        "errors": 0,
        "statuses": {},
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "_fine": {},
        "_coarse": {},
        "_min": math.inf,
        "_min_known": True,
        "_max": 0.0,
    }


def _add(g: dict[str, Any], r: Mapping[str, Any]) -> None:
    g["requests"] += r["requests"]
    g["errors"] += r["errors"]
    status = str(r["status"])
    g["statuses"][status] = g["statuses"].get(status, 0) + r["requests"]
    g["prompt_tokens"] += r["prompt_tokens"]
    g["completion_tokens"] += r["completion_tokens"]
    stored = r["latency_buckets"]
    if isinstance(stored, dict):
        latency.merge(g["_fine"], _sparse(stored, len(latency.BOUNDS_MS)))
    elif isinstance(stored, list):  # written before 0004: dense counts per LEGACY_BOUNDS_MS bucket
        latency.merge(g["_coarse"], _sparse(dict(enumerate(stored)), len(latency.LEGACY_BOUNDS_MS)))
    if r["latency_ms_min"] is not None:
        g["_min"] = min(g["_min"], r["latency_ms_min"])
    elif r["requests"] == 1:  # one request: its max is its min
        g["_min"] = min(g["_min"], r["latency_ms_max"])
    else:
        g["_min_known"] = False
    g["_max"] = max(g["_max"], r["latency_ms_max"])


def _sparse(stored: Mapping[Any, Any], top: int) -> dict[int, int]:
    """Stored bucket counts, keeping only well-formed entries (indices 0..top, positive integer counts)."""
    out: dict[int, int] = {}
    for i, c in stored.items():
        try:
            index = int(i)
        except (TypeError, ValueError):
            continue
        if 0 <= index <= top and isinstance(c, int) and not isinstance(c, bool) and c > 0:
            out[index] = c
    return out


def _finish(g: dict[str, Any]) -> dict[str, Any]:
    fine, coarse = g.pop("_fine"), g.pop("_coarse")
    low, known, peak = g.pop("_min"), g.pop("_min_known"), g.pop("_max")
    min_ms = low if known and math.isfinite(low) else None
    if coarse:  # some rows only know coarse buckets: compare everything at their resolution
        latency.merge(coarse, latency.coarsen(fine))
        counts, bounds = coarse, latency.LEGACY_BOUNDS_MS
    else:
        counts, bounds = fine, latency.BOUNDS_MS

    def quantile(q: float) -> float | None:
        value = latency.percentile(counts, q, min_ms=min_ms, max_ms=peak, bounds=bounds)
        return None if value is None else round(value, 3)

    return {
        **g,
        "latency_ms_min": None if min_ms is None else round(min_ms, 3),
        "latency_ms_p50": quantile(0.5),
        "latency_ms_p95": quantile(0.95),
        "latency_ms_max": round(peak, 3),
    }


_BUCKET_COLUMNS = ("bucket_start", "bucket_start_utc")
_MEASURE_COLUMNS = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "latency_ms_min",
    "latency_ms_p50",
    "latency_ms_p95",
    "latency_ms_max",
)
SUMMARY_COLUMNS = (*_BUCKET_COLUMNS, "key", "endpoint", "worker", "model", "fallback_from", "alias", *_MEASURE_COLUMNS)
SERIES_COLUMNS = (*_BUCKET_COLUMNS, *_MEASURE_COLUMNS)


def to_csv(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """Summary rows or series points as CSV (RFC 4180, a header line; ``bucket_start_utc`` is the bucket's
    start as ISO 8601 UTC). Used by the admin API's ``?format=csv`` and ``turnout usage --format csv``."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(columns)
    for row in rows:
        full = {**row, "bucket_start_utc": datetime.fromtimestamp(row["bucket_start"], UTC).isoformat()}
        writer.writerow([csv_cell(full.get(c)) for c in columns])
    return out.getvalue()


def csv_cell(value: Any) -> Any:
    """A CSV cell; text a spreadsheet would run as a formula (=, +, -, @, tab, CR first) gets a leading '."""
    if value is None:
        return ""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value
