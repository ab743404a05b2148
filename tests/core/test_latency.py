"""Latency histograms: bucket layout, percentiles against exact nearest-rank percentiles of the samples."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnout.core.latency import (
    BOUNDS_MS,
    LEGACY_BOUNDS_MS,
    MAX_MS,
    add,
    bucket_of,
    clamp_ms,
    coarsen,
    merge,
    percentile,
)


def histogram(samples: list[float]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for ms in samples:
        add(counts, ms)
    return counts


def exact(samples: list[float], q: float) -> float:
    """Nearest-rank: the k-th smallest sample, k = max(1, ceil(q * n))."""
    ordered = sorted(samples)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def estimate(samples: list[float], q: float) -> float:
    value = percentile(histogram(samples), q, min_ms=min(samples), max_ms=max(samples))
    assert value is not None
    return value


def allowed_error(samples: list[float], truth: float) -> float:
    """The bound stated in latency.percentile's docstring (plus float rounding slack)."""
    if truth > BOUNDS_MS[-1]:
        return max(samples) - BOUNDS_MS[-1]
    return max(0.1, truth / 10) * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize(
    ("ms", "bucket"),
    [(0, 0), (0.05, 0), (0.1, 0), (0.1001, 1), (1.0, 90), (1.05, 91), (7, 90 + 60), (100, 270), (1e7, 720)],
)
def test_bucket_of(ms: float, bucket: int) -> None:
    assert bucket_of(ms) == bucket


def test_bucket_of_past_the_last_bound_is_the_open_bucket() -> None:
    assert bucket_of(1e7 + 1) == len(BOUNDS_MS) == 721


def test_bounds_are_two_significant_digits_and_at_most_a_tenth_wide() -> None:
    assert list(BOUNDS_MS) == sorted(set(BOUNDS_MS))
    assert BOUNDS_MS[0] == 0.1 and BOUNDS_MS[-1] == 1e7
    for low, high in itertools.pairwise(BOUNDS_MS):
        assert high - low <= low / 10 * (1 + 1e-9)


def test_every_legacy_bound_is_a_bound() -> None:
    assert set(LEGACY_BOUNDS_MS) <= set(BOUNDS_MS)  # so coarsen() is exact


@pytest.mark.parametrize(
    ("samples", "q", "expected"),
    [
        ([51, 52, 59], 0.5, (51, 59)),  # the bug report: p50 75 ms above a 59 ms max
        ([59], 0.5, (59, 59)),
        ([59, 59, 59], 0.95, (59, 59)),
        ([40, 41], 0.0, (40, 40)),  # q = 0 is the minimum
        ([3, 3, 4, 4, 30, 30, 30, 30, 30, 200], 1.0, (200, 200)),  # q = 1 is the maximum
        ([3, 3, 4, 4, 30, 30, 30, 30, 30, 200], 0.5, (29, 30)),  # 5th of 10 is 30
        ([3, 3, 4, 4, 30, 30, 30, 30, 30, 200], 0.95, (190, 200)),
        ([0, 0, 0], 0.5, (0, 0)),
        ([2e7, 3e7], 0.5, (1e7, 3e7)),  # the open bucket ends at the maximum
    ],
)
def test_percentile_table(samples: list[float], q: float, expected: tuple[float, float]) -> None:
    low, high = expected
    assert low <= estimate(samples, q) <= high


def test_percentile_of_nothing_is_none() -> None:
    assert percentile({}, 0.5, min_ms=None, max_ms=0.0) is None
    assert percentile({3: 0}, 0.5, min_ms=None, max_ms=0.0) is None


def test_unknown_minimum_uses_the_bucket_and_never_passes_the_maximum() -> None:
    counts = histogram([51, 52, 59])
    value = percentile(counts, 0.5, min_ms=None, max_ms=59)
    assert value is not None and 50 < value <= 59


def test_inconsistent_maximum_still_bounds_the_estimate() -> None:
    value = percentile(histogram([80, 90]), 0.5, min_ms=None, max_ms=10)  # max below the bucket
    assert value == 10


@pytest.mark.parametrize(
    ("ms", "clamped"), [(5.0, 5.0), (0.0, 0.0), (-3.0, 0.0), (math.nan, 0.0), (math.inf, MAX_MS), (1e300, MAX_MS)]
)
def test_clamp_ms(ms: float, clamped: float) -> None:
    assert clamp_ms(ms) == clamped


def test_merge_and_coarsen() -> None:
    a, b = histogram([1, 2, 3]), histogram([3, 400, 2e7])
    merge(a, b)
    assert sum(a.values()) == 6 and a[bucket_of(3)] == 2
    coarse = coarsen(a)
    assert coarse == {0: 1, 1: 1, 2: 2, 8: 1, len(LEGACY_BOUNDS_MS): 1}  # (0,1], (1,2.5], (2.5,5], (250,500], open


latencies = st.one_of(
    st.floats(min_value=0, max_value=2e7, allow_nan=False),
    st.floats(min_value=0, max_value=200, allow_nan=False),  # where most real latencies are
    st.sampled_from(BOUNDS_MS),  # on a bucket bound exactly
    st.sampled_from(LEGACY_BOUNDS_MS),
)
samples_st = st.lists(latencies, min_size=1, max_size=300)
quantiles = st.one_of(st.sampled_from([0.0, 0.5, 0.9, 0.95, 0.99, 1.0]), st.floats(min_value=0, max_value=1))


@settings(max_examples=300, deadline=None)
@given(samples_st, quantiles)
def test_percentile_is_within_min_max_and_close_to_exact(samples: list[float], q: float) -> None:
    value, truth = estimate(samples, q), exact(samples, q)
    assert min(samples) <= value <= max(samples)
    assert abs(value - truth) <= allowed_error(samples, truth)


@settings(max_examples=150, deadline=None)
@given(samples_st, quantiles)
def test_legacy_resolution_stays_within_min_max_and_the_exact_values_bucket(samples: list[float], q: float) -> None:
    coarse = coarsen(histogram(samples))
    value = percentile(coarse, q, min_ms=min(samples), max_ms=max(samples), bounds=LEGACY_BOUNDS_MS)
    assert value is not None and min(samples) <= value <= max(samples)
    i = bucket_of(exact(samples, q), LEGACY_BOUNDS_MS)
    low = LEGACY_BOUNDS_MS[i - 1] if i > 0 else 0.0
    high = LEGACY_BOUNDS_MS[i] if i < len(LEGACY_BOUNDS_MS) else max(samples)
    assert low <= value <= high


@settings(max_examples=100, deadline=None)
@given(samples_st, samples_st, quantiles)
def test_merging_equals_counting_together(first: list[float], second: list[float], q: float) -> None:
    merged = histogram(first)
    merge(merged, histogram(second))
    assert merged == histogram(first + second)
    everything = first + second
    assert percentile(merged, q, min_ms=min(everything), max_ms=max(everything)) == estimate(everything, q)
