"""Where the time of proxied requests went, in numbers: one latency histogram per phase (``queue``, ``hold``,
``upstream``, ``ttft``, ``total``; :mod:`turnout.gateway.timing` says what each measures) by model, worker and
whether the answer streamed, for Prometheus (``turnout_request_phase_seconds``), and their median and 90th
percentile over the last minutes for the admin UI's Overview.

Two sets of counts, both cheap on the request path, which only appends its row of phases (they are counted
together, a bucket search each in C, when read, when a minute ends, or when 4096 wait):

* Prometheus's: every sample, exactly, in the buckets it exposes (:data:`turnout.core.latency.LEGACY_BOUNDS_MS`,
  the gateway's other latency histograms' too), 17 bounds: a short search.
* the Overview's percentiles: a sample of them (at most :data:`_FINE_SAMPLES` of each batch, evenly spaced, each
  weighing for the ones it stands for) in the fine buckets of :data:`turnout.core.latency.BOUNDS_MS` (two
  significant digits: a percentile off by at most a tenth of its value, plus what the sample leaves out: a few
  percent for a median estimated from hundreds of requests). Searching 721 bounds for every request cost more
  than all the rest of its timing (bench/README.md); a person glancing at a median needs no more.

The last minutes are the counts now less the counts as they were at that minute's start (a copy is kept at the
first sample, or the first read, of each minute, for :data:`KEEP_MINUTES` minutes); a window's request counts are
exact.

Labels are bounded: worker names by the fleet's configuration, endpoints and claims; model names by the fleet's
inventory (the proxy passes a model's name only when the worker that answered lists it, or serves it as a claim,
and :data:`OTHER_MODEL` otherwise: a worker whose inventory is not known is sent any name a client writes);
``stream`` is true or false. Time is a parameter (``now``, in seconds of a monotonic clock).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from functools import partial

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from turnout.core.latency import BOUNDS_MS, LEGACY_BOUNDS_MS, percentile

__all__ = [
    "KEEP_MINUTES",
    "OTHER_MODEL",
    "PHASE_NAMES",
    "VIEWS",
    "PhaseCollector",
    "PhaseStats",
    "Recent",
    "count_coarse",
    "exposed",
    "summarize",
]

PHASE_NAMES = ("queue", "hold", "upstream", "ttft", "total")
# What the Overview shows: (view, phase, stream): ttft and total mean different things for a stream (its first
# token, its end) and for an answer in one piece (both its end), so they are apart.
VIEWS = (
    ("queue", 0, None),
    ("hold", 1, None),
    ("upstream", 2, None),
    ("ttft_stream", 3, True),
    ("total_stream", 4, True),
    ("total_whole", 4, False),
)
OTHER_MODEL = "other"
KEEP_MINUTES = 15
_LE = [f"{bound / 1000:g}" for bound in LEGACY_BOUNDS_MS] + ["+Inf"]
# a bucket holds the values above the bound before it, up to its own (Prometheus's le), in seconds
_coarse = partial(bisect.bisect_left, tuple(bound / 1000 for bound in LEGACY_BOUNDS_MS))
_fine = partial(bisect.bisect_left, tuple(bound / 1000 for bound in BOUNDS_MS))
_FOLD_ROWS = 4096  # rows of one label set kept before they are counted (a bound on memory)
_FINE_SAMPLES = 256  # of a batch of rows, at most this many in the Overview's fine buckets
_Key = tuple[str, str, bool]  # (model, worker, stream)
_Mark = dict[_Key, tuple[list[list[int]], list[dict[int, int]]]]  # each series' counts, as they were
Recent = list[tuple[int, dict[int, int]]]  # per view: (requests, sampled fine bucket counts)


class _Series:
    """The counts of one label set, per phase: every sample per Prometheus bucket and their sum in seconds, a sample
    of them per fine bucket (weighted); and the requests recorded since the last fold, one row of phases each."""

    __slots__ = ("coarse", "fine", "rows", "sums")

    def __init__(self) -> None:
        self.coarse = [[0] * len(_LE) for _ in PHASE_NAMES]
        self.fine: list[dict[int, int]] = [{} for _ in PHASE_NAMES]
        self.sums = [0.0] * len(PHASE_NAMES)
        self.rows: list[tuple[float | None, float, float | None, float | None, float]] = []

    def fold(self) -> None:
        rows = self.rows
        if not rows:
            return
        self.rows = []
        for phase, column in enumerate(zip(*rows, strict=True)):
            # None: a phase the request did not go through (a hold of 0 too)
            values = [v for v in column if v is not None] if phase != 1 else [v for v in column if v]
            if not values:
                continue
            self.sums[phase] += count_coarse(self.coarse[phase], values)
            stride = max(1, len(values) // _FINE_SAMPLES)
            fine = self.fine[phase]
            for bucket, n in Counter(map(_fine, values[::stride])).items():
                fine[bucket] = fine.get(bucket, 0) + n * stride

    def mark(self) -> tuple[list[list[int]], list[dict[int, int]]]:
        return [list(c) for c in self.coarse], [dict(f) for f in self.fine]


class PhaseStats:
    def __init__(self) -> None:
        self._series: dict[_Key, _Series] = {}
        self._minute = -1  # the minute (now // 60) of the last sample or read
        self._next_minute = 0.0  # when the next one begins
        # (minute, the counts at its start): the copies of the last KEEP_MINUTES minutes that saw a sample or a read
        self._marks: deque[tuple[int, _Mark]] = deque()

    def record(
        self,
        model: str,
        worker: str,
        stream: bool,
        queue: float | None,
        hold: float,
        upstream: float | None,
        ttft: float | None,
        total: float,
        now: float,
    ) -> None:
        """One request's phases, in seconds (None, or a hold of 0: it did not go through that phase)."""
        if now >= self._next_minute:
            self._roll(now)
        key = (model, worker, stream)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series()
        rows = series.rows
        rows.append((queue, hold, upstream, ttft, total))
        if len(rows) >= _FOLD_ROWS:
            series.fold()

    def _fold(self) -> None:
        for series in self._series.values():
            series.fold()

    def _roll(self, now: float) -> None:
        """A new minute: the counts as they are now (every row counted) are its start's."""
        minute = int(now // 60)
        if minute <= self._minute:
            return
        self._fold()
        self._minute = minute
        self._next_minute = (minute + 1) * 60.0
        self._marks.append((minute, {key: s.mark() for key, s in self._series.items()}))
        while self._marks and self._marks[0][0] <= minute - KEEP_MINUTES:
            self._marks.popleft()

    def recent(self, minutes: int, now: float) -> dict[str, dict[str, float | int | None]]:
        """Per view (:data:`VIEWS`): ``count`` (exact), ``p50`` and ``p90`` in milliseconds (None without samples)
        of the requests of the last ``minutes`` minutes (1 to :data:`KEEP_MINUTES`: this minute so far and the ones
        before it)."""
        return summarize([self.recent_counts(minutes, now)])

    def recent_counts(self, minutes: int, now: float) -> Recent:
        """What :meth:`recent` summarizes, per view in :data:`VIEWS`' order: the request count and the sample's
        fine bucket counts (several processes' add up: :func:`summarize`)."""
        minutes = max(1, min(minutes, KEEP_MINUTES))
        self._roll(now)
        self._fold()
        start = self._minute - minutes + 1
        # the counts at the start of minute `start`: the first copy made at or after it (nothing was counted between
        # the last sample before that copy and it); none: this process started after it
        before: _Mark = next((mark for minute, mark in self._marks if minute >= start), {})
        counts = [0] * len(VIEWS)
        merged: list[dict[int, int]] = [{} for _ in VIEWS]
        for key, series in self._series.items():
            then = before.get(key)
            for v, (_, phase, stream) in enumerate(VIEWS):
                if stream is not None and key[2] is not stream:
                    continue
                counts[v] += sum(series.coarse[phase]) - (sum(then[0][phase]) if then is not None else 0)
                into = merged[v]
                old = then[1][phase] if then is not None else {}
                for bucket, n in series.fine[phase].items():
                    n -= old.get(bucket, 0)
                    if n:
                        into[bucket] = into.get(bucket, 0) + n
        return list(zip(counts, merged, strict=True))

    def families(self) -> Iterator[HistogramMetricFamily]:
        self._fold()
        family = HistogramMetricFamily(
            "turnout_request_phase_seconds",
            "where proxied requests' time went, by phase: queue (waiting for a slot), hold (waiting for a wake or an "
            "activation), upstream (connecting to the worker), ttft (the worker's first byte: a stream's first "
            "chunk, else its answer), total (the whole request; a stream to its end); model: as the worker's "
            "inventory lists it, else other",
            labels=["phase", "model", "worker", "stream"],
        )
        for (model, worker, stream), series in sorted(self._series.items()):
            for phase, (name, coarse) in enumerate(zip(PHASE_NAMES, series.coarse, strict=True)):
                if any(coarse):
                    family.add_metric([name, model, worker, str(stream).lower()], *exposed(coarse, series.sums[phase]))
        yield family


def count_coarse(counts: list[int], values: list[float]) -> float:
    """Count ``values`` (seconds) into ``counts``, one per Prometheus bucket (the last: above every bound); their
    sum."""
    for bucket, n in Counter(map(_coarse, values)).items():
        counts[bucket] += n
    return math.fsum(values)


def exposed(counts: list[int], total: float) -> tuple[list[tuple[str, float]], float]:
    """(cumulative Prometheus buckets, the sum) of :func:`count_coarse`'s counts."""
    cumulative, buckets = 0, []
    for le, n in zip(_LE, counts, strict=True):
        cumulative += n
        buckets.append((le, float(cumulative)))
    return buckets, total


def summarize(parts: Iterable[Recent]) -> dict[str, dict[str, float | int | None]]:
    """:meth:`PhaseStats.recent` of the counts of one or several processes (:meth:`PhaseStats.recent_counts`)
    added up: each view's count, median and 90th percentile over all of their requests."""
    counts = [0] * len(VIEWS)
    merged: list[dict[int, int]] = [{} for _ in VIEWS]
    for part in parts:
        for v, (n, fine) in enumerate(part):
            counts[v] += n
            into = merged[v]
            for bucket, k in fine.items():
                into[bucket] = into.get(bucket, 0) + k
    return {view: _summary(n, fine) for (view, _, _), n, fine in zip(VIEWS, counts, merged, strict=True)}


def _summary(count: int, fine: dict[int, int]) -> dict[str, float | int | None]:
    fine = {bucket: n for bucket, n in fine.items() if n > 0}
    if not count or not fine:
        return {"count": count, "p50": None, "p90": None}
    top = max(fine)
    high = BOUNDS_MS[top] if top < len(BOUNDS_MS) else BOUNDS_MS[-1] * 10  # (the open bucket: above 2.8 hours)
    p50 = percentile(fine, 0.5, min_ms=None, max_ms=high)
    p90 = percentile(fine, 0.9, min_ms=None, max_ms=high)
    return {"count": count, "p50": p50, "p90": p90}


class PhaseCollector(Collector):
    """``turnout_request_phase_seconds``, read from a :class:`PhaseStats` at scrape time (a prometheus_client
    Histogram takes a lock and searches its buckets once per sample and label set)."""

    def __init__(self, stats: PhaseStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[HistogramMetricFamily]:
        return self.stats.families()
