"""Where the time of proxied requests went, in numbers: one latency histogram per phase (``queue``, ``hold``,
``upstream``, ``ttft``, ``total``; :mod:`turnout.gateway.timing` says what each measures) by model, worker and
whether the answer streamed, for Prometheus (``turnout_request_phase_seconds``), and their median and 90th
percentile over the last minutes for the admin UI's Overview.

One set of counts serves both: each sample goes into its phase's histogram of :data:`turnout.core.latency.BOUNDS_MS`
(two significant digits, so a percentile is off by at most a tenth of its value); Prometheus gets them coarsened to
its buckets (every one of which is one of those bounds, so exactly), and the last minutes are the counts now less
the counts as they were at that minute's start (a copy of the counts is kept at the first sample, or the first
read, of each minute, for :data:`KEEP_MINUTES` minutes). A sample costs a bucket search and a count; copies and
percentiles are made once a minute and on read.

Labels are bounded: worker names by the fleet's configuration, endpoints and claims; model names by the fleet's
inventory (the proxy passes a model's name only when the worker that answered lists it, or serves it as a claim,
and :data:`OTHER_MODEL` otherwise: a worker whose inventory is not known is sent any name a client writes);
``stream`` is true or false. Time is a parameter (``now``, in seconds of a monotonic clock).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from turnout.core.latency import BOUNDS_MS, LEGACY_BOUNDS_MS, coarsen, percentile

__all__ = ["KEEP_MINUTES", "OTHER_MODEL", "PHASE_NAMES", "VIEWS", "PhaseCollector", "PhaseStats"]

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
_Key = tuple[str, str, bool]  # (model, worker, stream)


class _Series:
    """The counts of one label set: per phase, samples per bucket (sparse) and their sum in seconds."""

    __slots__ = ("counts", "sums")

    def __init__(self) -> None:
        self.counts: list[dict[int, int]] = [{} for _ in PHASE_NAMES]
        self.sums = [0.0] * len(PHASE_NAMES)


class PhaseStats:
    def __init__(self) -> None:
        self._series: dict[_Key, _Series] = {}
        self._minute = -1  # the minute (now // 60) of the last sample or read
        # (minute, the counts at its start): the copies of the last KEEP_MINUTES minutes that saw a sample or a read
        self._marks: deque[tuple[int, dict[_Key, list[dict[int, int]]]]] = deque()

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
        if now // 60 > self._minute:
            self._roll(now)
        key = (model, worker, stream)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series()
        counts, sums = series.counts, series.sums
        if queue is not None:
            _add(counts[0], queue)
            sums[0] += queue
        if hold:
            _add(counts[1], hold)
            sums[1] += hold
        if upstream is not None:
            _add(counts[2], upstream)
            sums[2] += upstream
        if ttft is not None:
            _add(counts[3], ttft)
            sums[3] += ttft
        _add(counts[4], total)
        sums[4] += total

    def _roll(self, now: float) -> None:
        """A new minute: the counts as they are now are its start's."""
        minute = int(now // 60)
        self._minute = minute
        self._marks.append((minute, {key: [dict(c) for c in s.counts] for key, s in self._series.items()}))
        while self._marks and self._marks[0][0] <= minute - KEEP_MINUTES:
            self._marks.popleft()

    def recent(self, minutes: int, now: float) -> dict[str, dict[str, float | int | None]]:
        """Per view (:data:`VIEWS`): ``count``, ``p50`` and ``p90`` in milliseconds (None without samples) of the
        samples of the last ``minutes`` minutes (1 to :data:`KEEP_MINUTES`: this minute so far and the ones before
        it)."""
        minutes = max(1, min(minutes, KEEP_MINUTES))
        if now // 60 > self._minute:
            self._roll(now)
        start = self._minute - minutes + 1
        # the counts at the start of minute `start`: the first copy made at or after it (nothing was counted between
        # the last sample before that copy and it); none: this process started after it
        before = next((mark for minute, mark in self._marks if minute >= start), {})
        merged: list[dict[int, int]] = [{} for _ in VIEWS]
        for key, series in self._series.items():
            then = before.get(key)
            for v, (_, phase, stream) in enumerate(VIEWS):
                if stream is not None and key[2] is not stream:
                    continue
                into = merged[v]
                old = then[phase] if then is not None else {}
                for bucket, n in series.counts[phase].items():
                    n -= old.get(bucket, 0)
                    if n:
                        into[bucket] = into.get(bucket, 0) + n
        return {view: _summary(counts) for (view, _, _), counts in zip(VIEWS, merged, strict=True)}

    def families(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "turnout_request_phase_seconds",
            "where proxied requests' time went, by phase: queue (waiting for a slot), hold (waiting for a wake or an "
            "activation), upstream (connecting to the worker), ttft (the worker's first byte: a stream's first "
            "chunk, else its answer), total (the whole request; a stream to its end); model: as the worker's "
            "inventory lists it, else other",
            labels=["phase", "model", "worker", "stream"],
        )
        for (model, worker, stream), series in sorted(self._series.items()):
            for phase, (name, counts) in enumerate(zip(PHASE_NAMES, series.counts, strict=True)):
                if not counts:
                    continue
                dense = coarsen(counts)
                cumulative, buckets = 0, []
                for i, le in enumerate(_LE):
                    cumulative += dense.get(i, 0)
                    buckets.append((le, float(cumulative)))
                family.add_metric([name, model, worker, str(stream).lower()], buckets, series.sums[phase])
        yield family


def _add(counts: dict[int, int], seconds: float) -> None:
    bucket = bisect.bisect_left(BOUNDS_MS, seconds * 1000)
    counts[bucket] = counts.get(bucket, 0) + 1


def _summary(counts: dict[int, int]) -> dict[str, float | int | None]:
    if not counts:
        return {"count": 0, "p50": None, "p90": None}
    top = max(counts)
    high = BOUNDS_MS[top] if top < len(BOUNDS_MS) else BOUNDS_MS[-1] * 10  # (the open bucket: above 2.8 hours)
    p50 = percentile(counts, 0.5, min_ms=None, max_ms=high)
    p90 = percentile(counts, 0.9, min_ms=None, max_ms=high)
    return {"count": sum(counts.values()), "p50": p50, "p90": p90}


class PhaseCollector(Collector):
    """``turnout_request_phase_seconds``, read from a :class:`PhaseStats` at scrape time (a prometheus_client
    Histogram takes a lock and searches its buckets once per sample and label set)."""

    def __init__(self, stats: PhaseStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[HistogramMetricFamily]:
        return self.stats.families()
