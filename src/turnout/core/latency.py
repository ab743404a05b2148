"""Latency histograms for usage roll-ups: fixed log-linear buckets, sparse counts, merge, percentiles.

Used by :mod:`turnout.store.usage`, which keeps one histogram per roll-up and computes p50/p95 on read.

Buckets. The upper bounds ``BOUNDS_MS`` are every number with two significant digits from 0.1 ms to
9.9e6 ms, then 1e7 ms (0.10, 0.11, ..., 0.99, 1.0, 1.1, ..., 9.9, 10, 11, ..., 99, 100, 110, ...). Bucket
``i`` holds ``BOUNDS_MS[i-1] < ms <= BOUNDS_MS[i]`` (bucket 0 starts at 0); the open bucket
``len(BOUNDS_MS)`` holds everything above 1e7 ms (2.8 h). Every bucket above the first is at most a tenth of
its lower bound wide. Counts are sparse (``{bucket: count}``): a roll-up stores one number per distinct bucket.

``LEGACY_BOUNDS_MS`` are the coarse bounds that roll-ups were written with before (dense lists); every one of
them is also in ``BOUNDS_MS``, so :func:`coarsen` maps a fine histogram onto them exactly, and the two can be
merged at the coarse resolution.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

__all__ = [
    "BOUNDS_MS",
    "LEGACY_BOUNDS_MS",
    "MAX_MS",
    "add",
    "bucket_of",
    "clamp_ms",
    "coarsen",
    "merge",
    "percentile",
]

BOUNDS_MS: tuple[float, ...] = (
    *(float(f"{m}e{e}") for e in range(-2, 6) for m in range(10, 100)),
    1e7,
)

LEGACY_BOUNDS_MS: tuple[float, ...] = (
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

# No request lasts a year; a latency beyond this (or NaN, or negative) is a clock or arithmetic fault.
MAX_MS = 365 * 86_400_000.0


def clamp_ms(ms: float) -> float:
    """A latency made storable: NaN and negatives become 0, anything above ``MAX_MS`` becomes ``MAX_MS``."""
    if not ms > 0:  # also NaN
        return 0.0
    return min(float(ms), MAX_MS)


def bucket_of(ms: float, bounds: Sequence[float] = BOUNDS_MS) -> int:
    return bisect.bisect_left(bounds, ms)


def add(counts: dict[int, int], ms: float) -> None:
    i = bucket_of(ms)
    counts[i] = counts.get(i, 0) + 1


def merge(into: dict[int, int], counts: Mapping[int, int]) -> None:
    for i, c in counts.items():
        into[i] = into.get(i, 0) + c


def coarsen(counts: Mapping[int, int]) -> dict[int, int]:
    """A ``BOUNDS_MS`` histogram as a ``LEGACY_BOUNDS_MS`` one (exact: each fine bucket lies in one coarse)."""
    out: dict[int, int] = {}
    for i, c in counts.items():
        j = len(LEGACY_BOUNDS_MS) if i >= len(BOUNDS_MS) else bucket_of(BOUNDS_MS[i], LEGACY_BOUNDS_MS)
        out[j] = out.get(j, 0) + c
    return out


def percentile(
    counts: Mapping[int, int],
    q: float,
    *,
    min_ms: float | None,
    max_ms: float,
    bounds: Sequence[float] = BOUNDS_MS,
) -> float | None:
    """The q-quantile (0 <= q <= 1) of the samples counted in ``counts``; None when there are none.

    The exact value it estimates is the nearest-rank quantile: the k-th smallest of the n samples, with
    k = max(1, ceil(q * n)). The estimate is searched in the bucket holding that k-th sample, narrowed to
    ``[min_ms, max_ms]`` (the smallest and largest sample, when known), the bucket's samples taken as evenly
    spread across it. So:

    * it always lies within ``[min_ms, max_ms]``, and equals ``max_ms`` for q = 1 (``min_ms`` for q = 0);
    * it is off from the exact value by at most the width of that narrowed bucket: with ``BOUNDS_MS``, at
      most max(0.1 ms, 10 % of the exact value) up to 1e7 ms, and at most ``max_ms - 1e7`` above.
      (With ``LEGACY_BOUNDS_MS`` the bound is the coarse bucket's width, up to 1.5 times its lower bound.)

    ``min_ms`` may be None (unknown); the bucket's own lower bound is used then.
    """
    total = sum(c for c in counts.values() if c > 0)
    if total == 0:
        return None
    k = min(total, max(1, math.ceil(q * total)))
    seen = 0
    for i in sorted(counts):
        c = counts[i]
        if c <= 0:
            continue
        if seen + c < k:
            seen += c
            continue
        top = min(i, len(bounds))
        low = float(bounds[top - 1]) if top > 0 else 0.0
        high = float(bounds[top]) if top < len(bounds) else max(max_ms, low)
        lo = low if min_ms is None else max(low, min_ms)
        hi = min(high, max_ms)
        lo = min(lo, hi)  # only inconsistent input (a max below the bucket) gets here
        position = k - seen  # 1..c within the bucket
        if c > 1:
            fraction = (position - 1) / (c - 1)
        elif min_ms is not None and (low < min_ms or top == 0) and min_ms <= high:
            fraction = 0.0  # the bucket's one sample is the smallest
        elif low < max_ms <= high:
            fraction = 1.0  # ... or the largest
        else:
            fraction = 0.5
        return lo + (hi - lo) * fraction
    raise AssertionError("unreachable: k <= total")  # pragma: no cover
