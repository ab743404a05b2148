"""Which running batch request a waiting request stops (turnout.core.preemption): tables, and properties against a
brute-force reading of the rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from turnout.core.admission import Priority
from turnout.core.preemption import PREEMPTORS, SLOT_HELD, STOPS_MOST, Running, may_stop, victim

M = "m:1"
RUNNING = [
    Running("l1", "a", M, 10.0),
    Running("l2", "b", M, 12.0),  # the last to start of the model's
    Running("l3", "c", "other", 20.0),  # another model's
]


def test_the_batch_request_that_started_last_is_stopped() -> None:
    assert victim(RUNNING, Priority.INTERACTIVE, "worker", M, {"a", "b", "c"}) == RUNNING[1]


def test_only_on_a_worker_the_waiting_request_may_use() -> None:
    assert victim(RUNNING, Priority.INTERACTIVE, "worker", M, {"a"}) == RUNNING[0]  # b is not a candidate for it
    assert victim(RUNNING, Priority.INTERACTIVE, "worker", M, {"c"}) is None  # c runs another model's request


def test_standard_stops_batch_and_batch_stops_nothing() -> None:
    assert victim(RUNNING, Priority.STANDARD, "saturated", M, {"a", "b"}) == RUNNING[1]
    assert victim(RUNNING, Priority.BATCH, "saturated", M, {"a", "b"}) is None


def test_only_when_it_waits_for_a_slot_a_running_request_holds() -> None:
    for why in ("worker", "model", "total", "saturated"):
        assert victim(RUNNING, Priority.INTERACTIVE, why, M, {"a", "b"}) is not None
    # its tenant at its cap, a waiter ahead, batch's own share: stopping a batch request would not start it
    for why in ("tenant", "ahead", "worker_batch", "model_batch", ""):
        assert victim(RUNNING, Priority.INTERACTIVE, why, M, {"a", "b"}) is None


def test_nothing_running_nothing_stopped() -> None:
    assert victim([], Priority.INTERACTIVE, "worker", M, {"a"}) is None


runs = st.lists(
    st.builds(
        Running,
        st.text("lx0123", min_size=1, max_size=4),
        st.sampled_from("abcd"),
        st.sampled_from([M, "other"]),
        st.floats(0, 100, allow_nan=False),
        st.none(),
        st.booleans(),
    ),
    max_size=12,
    unique_by=lambda r: r.lease,
)


@given(
    runs,
    st.sampled_from(list(Priority)),
    st.sampled_from(["worker", "model", "total", "saturated", "tenant", "ahead", "worker_batch"]),
    st.sets(st.sampled_from("abcd")),
)
def test_the_victim_is_the_latest_eligible_one(
    running: list[Running], priority: Priority, why: str, workers: set[str]
) -> None:
    chosen = victim(running, priority, why, M, workers)
    eligible = [r for r in running if r.model == M and r.worker in workers]
    if priority not in PREEMPTORS or why not in SLOT_HELD or not eligible:
        assert chosen is None
    else:
        assert chosen in eligible
        answering = [r for r in eligible if r.answering]
        assert chosen.answering or not answering  # one whose answer has begun, if any has
        assert all((r.since, r.lease) <= (chosen.since, chosen.lease) for r in answering or eligible)


def test_a_line_may_be_stopped_until_it_was_stopped_stops_most_times() -> None:
    assert [may_stop(n) for n in range(STOPS_MOST + 2)] == [True] * STOPS_MOST + [False, False]


def test_a_line_whose_answer_has_begun_is_stopped_before_one_in_its_prefill() -> None:
    """A line in its prefill frees its slot only once the prefill ends: the one that started last of those answering
    is stopped, and one in its prefill only when none answers."""
    lines = [
        Running("old", "a", M, 10.0),
        Running("newer", "b", M, 12.0),
        Running("newest", "c", M, 14.0, answering=False),  # just sent again: in its prefill
    ]
    chosen = victim(lines, Priority.INTERACTIVE, "worker", M, {"a", "b", "c"})
    assert chosen is not None and chosen.lease == "newer"
    prefilling = [r._replace(answering=False) for r in lines]
    chosen = victim(prefilling, Priority.INTERACTIVE, "worker", M, {"a", "b", "c"})
    assert chosen is not None and chosen.lease == "newest"
