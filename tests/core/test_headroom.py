"""What batch requests may hold (turnout.core.headroom): tables, and the recent peak against a brute-force one."""

from __future__ import annotations

import random

import pytest

from turnout.core.headroom import RecentPeak, batch_caps, batch_room


@pytest.mark.parametrize(
    ("slots", "share", "room"),
    [
        ([1, 1, 1], 0.5, 1),  # three one-slot engines: one runs batch, two stay free
        ([1, 1, 1, 1], 0.5, 2),
        ([2, 2, 2], 0.5, 3),
        ([4], 0.25, 1),
        ([1], 0.1, 1),  # at least one: batch is never shut out
        ([1, 1, 1], 1.0, None),  # no headroom
        ([1, None, 1], 0.5, None),  # a batching engine of unknown capacity: no cap known
        ([], 0.5, 1),
    ],
)
def test_batch_room(slots: list[int | None], share: float, room: int | None) -> None:
    assert batch_room(slots, share) == room


@pytest.mark.parametrize(
    ("worker", "fleet", "others", "caps"),
    [
        (1, [1, 1, 1], 0, (1, None)),  # nothing else wanted the model lately: batch takes it all (its slots)
        (2, [2, 2, 2], 0, (2, None)),  # ... never more than a worker's slots (none queues in the engine)
        (None, [None, 4], 0, (None, None)),  # a batching engine of unknown capacity: no cap
        (1, [1, 1, 1], 1, (1, 2)),  # the others needed one slot at most: batch may hold the other two
        (1, [1, 1, 1], 3, (1, 1)),  # they needed all: the share (at least one)
        (1, [1, 1, 1], 5, (1, 1)),
        (2, [2, 2, 2], 1, (1, 5)),  # a worker's own share holds whatever the fleet's
        (2, None, 1, (1, None)),  # a single candidate: its own share only
        (None, [None, 4], 1, (None, None)),  # a batching engine of unknown capacity: no cap
        (4, [4, 4], 2, (2, 6)),
    ],
)
def test_batch_caps(
    worker: int | None, fleet: list[int | None] | None, others: int, caps: tuple[int | None, int | None]
) -> None:
    assert batch_caps(worker, fleet, 0.5, others) == caps


@pytest.mark.parametrize(
    ("speed", "fleet", "others", "caps"),
    [
        (1, [1, 1, 1], 3, (1, 1)),  # four time-shared slots each, counted as one: the interactive peak needs all three
        (1, [1, 1, 1], 1, (1, 2)),  # ... it needed one engine's worth: batch may hold two engines' worth
        (1, [1, 1, 1], 0, (4, None)),  # nothing else wanted the model lately: every slot (batch loses nothing)
        (2, [2, 2], 1, (1, 3)),  # half-shared (two at full speed of four)
        (None, [4, 4], 2, (2, 6)),  # not learned: the slots
    ],
)
def test_batch_caps_count_what_an_engine_gets_through_at_full_speed(
    speed: int | None, fleet: list[int | None], others: int, caps: tuple[int | None, int | None]
) -> None:
    assert batch_caps(4, fleet, 0.5, others, speed) == caps


@pytest.mark.parametrize(("worker", "others"), [(1, 0), (1, 3), (4, 2), (None, 2)])
def test_a_whole_share_is_every_slot_and_no_more(worker: int | None, others: int) -> None:
    assert batch_caps(worker, [worker, 1], 1.0, others) == (worker, None)


def test_recent_peak_forgets_after_its_window() -> None:
    peak = RecentPeak(10.0)
    assert peak.peak(0.0) == 0
    peak.see(2, 101.0)
    peak.see(1, 105.0)
    assert peak.peak(111.0) == 2
    assert peak.peak(111.5) == 1  # the 2 seen 10.5 s ago: gone
    assert peak.peak(116.0) == 0


def test_recent_peak_matches_brute_force() -> None:
    """Counts seen and peaks asked at random times (going forward) against the max over the window."""
    rng = random.Random(7)
    for _ in range(200):
        window = rng.choice([1.0, 5.0, 30.0])
        peak = RecentPeak(window)
        seen: list[tuple[float, int]] = []
        now = 0.0
        for _ in range(rng.randint(1, 80)):
            now += rng.random() * window / 3
            if rng.random() < 0.6:
                count = rng.randint(0, 6)
                peak.see(count, now)
                seen.append((now, count))
            else:
                want = max((c for t, c in seen if now - t <= window), default=0)
                assert peak.peak(now) == want
