"""turnout.core.admission's rules that every keeper follows (the keepers' tables: tests/gateway/test_occupancy.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnout.core.admission import (
    BATCH_AGEING_S,
    CLASS_BAND,
    Caps,
    Counts,
    Priority,
    moved,
    queue_score,
    refusal,
    served_as,
)


@pytest.mark.parametrize(
    ("seen", "count", "expected"),
    [
        (None, 5, False),  # nothing ranked (one candidate): nothing to check
        (0, 0, False),
        (0, 1, True),  # another take landed between the view and this take
        (2, 3, True),
        (3, 2, False),  # a request ended meanwhile: the choice is better than it was
        (3, 3, False),
    ],
)
def test_a_decision_holds_while_its_worker_took_nothing_more(seen: int | None, count: int, expected: bool) -> None:
    assert moved(seen, count) is expected


@given(st.integers(0, 50), st.integers(0, 50))
def test_moved_is_exactly_more_than_was_seen(seen: int, count: int) -> None:
    assert moved(seen, count) == (count > seen)


@pytest.mark.parametrize(
    ("counts", "caps", "expected"),
    [
        (Counts(1, 1, 1, 1, 0, 0), Caps(), None),
        (Counts(2, 0, 0, 0, 0, 0), Caps(total=2), "total"),
        (Counts(5, 1, 0, 1, 0, 0), Caps(total=9, worker=1), "worker"),  # the first at its cap, in Caps' order
        (Counts(0, 0, 3, 3, 0, 0), Caps(tenant=3, worker=3), "tenant"),
    ],
)
def test_the_first_count_at_its_cap_refuses(counts: Counts, caps: Caps, expected: str | None) -> None:
    assert refusal(counts, caps) == expected


@pytest.mark.parametrize(
    ("priority", "waited", "served"),
    [
        (Priority.BATCH, 0.0, Priority.BATCH),
        (Priority.BATCH, BATCH_AGEING_S - 0.001, Priority.BATCH),
        (Priority.BATCH, BATCH_AGEING_S, Priority.STANDARD),
        (Priority.INTERACTIVE, 10 * BATCH_AGEING_S, Priority.INTERACTIVE),
        (Priority.STANDARD, 10 * BATCH_AGEING_S, Priority.STANDARD),
    ],
)
def test_a_batch_request_that_waited_the_ageing_time_is_served_as_standard(
    priority: Priority, waited: float, served: Priority
) -> None:
    assert served_as(priority, waited) is served
    assert queue_score(priority, 1.0, waited) == served.rank * CLASS_BAND + 1.0
