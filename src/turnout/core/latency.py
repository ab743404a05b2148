"""Latency histograms for usage roll-ups: fixed bucket bounds, merge, percentile by interpolation."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

__all__ = ["BOUNDS_MS", "bucket_of", "empty", "merge", "percentile"]

# Upper bounds (ms) of each bucket; the last bucket is everything above the last bound.
BOUNDS_MS: tuple[float, ...] = (
    1,
    2.5,
    5,
    10,
    25,
    50,
    100,
    250,
    500,
    1000,
    2500,
    5000,
    10_000,
    30_000,
    60_000,
    120_000,
    300_000,
)


def empty() -> list[int]:
    return [0] * (len(BOUNDS_MS) + 1)


def bucket_of(ms: float) -> int:
    return bisect.bisect_left(BOUNDS_MS, ms)


def merge(into: list[int], counts: Sequence[int]) -> None:
    for i, c in enumerate(counts):
        into[i] += c


def percentile(counts: Sequence[int], q: float, max_ms: float | None = None) -> float:
    """The q-quantile, interpolated linearly inside its bucket (the open last bucket ends at ``max_ms``)."""
    total = sum(counts)
    if total == 0:
        return 0.0
    rank = q * total
    seen = 0
    for i, c in enumerate(counts):
        if c and seen + c >= rank:
            low = 0.0 if i == 0 else BOUNDS_MS[i - 1]
            high = BOUNDS_MS[i] if i < len(BOUNDS_MS) else max(max_ms or low, low)
            return round(low + (high - low) * ((rank - seen) / c), 3)
        seen += c
    return float(BOUNDS_MS[-1])
