import pytest

from turnout.core.latency import BOUNDS_MS, bucket_of, empty, merge, percentile


@pytest.mark.parametrize(("ms", "bucket"), [(0.2, 0), (1, 0), (1.01, 1), (7, 3), (100, 6), (10**6, len(BOUNDS_MS))])
def test_bucket_of(ms: float, bucket: int) -> None:
    assert bucket_of(ms) == bucket


def test_percentile_interpolates() -> None:
    counts = empty()
    for ms in [3, 3, 4, 4, 30, 30, 30, 30, 30, 200]:
        counts[bucket_of(ms)] += 1
    assert percentile(counts, 0.5) == pytest.approx(25 + 25 * (1 / 5))  # 5th of 10 falls in (25, 50]
    assert 100 < percentile(counts, 0.95) <= 250
    assert percentile(empty(), 0.5) == 0.0


def test_merge() -> None:
    a, b = empty(), empty()
    a[2], b[2], b[5] = 1, 2, 3
    merge(a, b)
    assert a[2] == 3 and a[5] == 3 and sum(a) == 6
