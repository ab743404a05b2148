import pytest

from turnout.core.limits import (
    DAY_S,
    KeyLimitState,
    decide,
    estimate_tokens,
    learn_bytes_per_token,
    prompt_estimate,
    seconds_to_next_day,
)

T0 = 1_800_000_000.0 - (1_800_000_000.0 % DAY_S) + 3600  # 01:00 UTC on some day


def test_rpm_sliding_window() -> None:
    s = KeyLimitState()
    assert [s.admit(T0 + i, rpm=3, daily=None, estimate=1).allowed for i in range(4)] == [True] * 3 + [False]
    refused = s.admit(T0 + 10, rpm=3, daily=None, estimate=1)
    assert not refused.allowed and refused.retry_after == 50 and "3 requests per minute" in refused.reason
    assert refused.rpm_remaining == 0
    assert s.admit(T0 + 60, rpm=3, daily=None, estimate=1).allowed  # the first one left the window
    assert not s.admit(T0 + 60.5, rpm=3, daily=None, estimate=1).allowed


def test_an_admission_without_a_rate_takes_no_place_in_the_window() -> None:
    """A Batch API line is admitted with the key's daily tokens and no rate: the key's own rate stays whole."""
    s = KeyLimitState()
    assert all(s.admit(T0 + i / 100, rpm=None, daily=1000, estimate=1).allowed for i in range(50))
    assert [s.admit(T0 + 1, rpm=2, daily=1000, estimate=1).allowed for _ in range(3)] == [True, True, False]
    assert s.used == 52


@pytest.mark.parametrize(
    ("daily", "estimates", "expected"),
    [
        (100, [40, 40, 40], [True, True, False]),
        (100, [100], [True]),
        (100, [101], [False]),
        (None, [10**9], [True]),
    ],
)
def test_daily_tokens_reserve(daily: int | None, estimates: list[int], expected: list[bool]) -> None:
    s = KeyLimitState()
    assert [s.admit(T0, rpm=None, daily=daily, estimate=e).allowed for e in estimates] == expected


def test_settle_and_refund() -> None:
    s = KeyLimitState()
    first = s.admit(T0, None, 100, 60)
    assert first.allowed
    s.settle(first.day, reserved=60, actual=10)  # real usage was smaller: 50 freed
    assert s.used == 10
    second = s.admit(T0 + 2, None, 100, 60)
    assert second.allowed
    s.refund(second.day, reserved=60)  # upstream failed
    assert s.used == 10
    refused = s.admit(T0, None, 100, 91)
    assert not refused.allowed and refused.tokens_remaining == 90
    assert refused.retry_after == int(DAY_S - 3600)


def test_new_day_resets_and_old_settlements_are_ignored() -> None:
    s = KeyLimitState()
    yesterday = s.admit(T0, None, 100, 100)
    assert yesterday.allowed
    tomorrow = T0 + DAY_S
    assert s.admit(tomorrow, None, 100, 50).allowed and s.used == 50
    s.settle(yesterday.day, reserved=100, actual=90)  # a request that finished after midnight
    assert s.used == 50


def test_estimate_and_day_boundary() -> None:
    assert estimate_tokens(400, 50, 256) == 150
    assert estimate_tokens(400, None, 256) == 356
    assert estimate_tokens(0, 0, 10) == 11
    assert estimate_tokens(400, 50, 256, bytes_per_token=8.0) == 100
    assert seconds_to_next_day(T0) == DAY_S - 3600


@pytest.mark.parametrize(
    ("body", "ratio", "tokens"),
    [
        (400, None, 100),  # nothing learned: 4 bytes a token
        (401, None, 100),
        (0, None, 1),  # at least one
        (112, 8.0, 14),  # a short prompt's body, its framing learned: 14, not 28
        (115, 8.0, 14),  # rounded
        (3, 8.0, 1),
    ],
)
def test_prompt_estimate(body: int, ratio: float | None, tokens: int) -> None:
    assert prompt_estimate(body, ratio) == tokens


@pytest.mark.parametrize(
    ("previous", "body", "counted", "learned"),
    [
        (None, 112, 14, 8.0),  # the first count is the figure
        (8.0, 400, 100, 8.0 + 0.3 * (4.0 - 8.0)),  # then a weighted mean, following the latest answers
        (8.0, 112, 0, 8.0),  # a count of 0 teaches nothing
        (None, 0, 10, None),
        (None, 10_000, 1, 64.0),  # bounded: a sample this far out says more about the sample
        (None, 10, 100, 1.0),
    ],
)
def test_learn_bytes_per_token(previous: float | None, body: int, counted: int, learned: float | None) -> None:
    assert learn_bytes_per_token(previous, body, counted) == pytest.approx(learned)


@pytest.mark.parametrize(
    ("in_window", "oldest", "used", "allowed", "reason"),
    [
        (0, None, 0, True, ""),
        (49, T0 - 30, 0, True, ""),
        (50, T0 - 30, 0, False, "rate limit of 50 requests per minute reached"),
        (0, None, 990, False, "daily token limit of 1000 reached (990 used or reserved, this request needs ~20)"),
        (0, None, 980, True, ""),
    ],
)
def test_decide_from_counts(in_window: int, oldest: float | None, used: int, allowed: bool, reason: str) -> None:
    d = decide(T0, 50, 1000, 20, in_window=in_window, oldest=oldest, used=used)
    assert d.allowed is allowed and d.reason == reason
    if allowed:
        assert d.rpm_remaining == 50 - in_window - 1 and d.tokens_remaining == 1000 - used - 20 and d.at == T0
    elif oldest is not None:
        assert d.retry_after == 30
