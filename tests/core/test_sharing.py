"""What an engine running several requests at once does to each (turnout.core.sharing), and how routing weighs
it (turnout.core.routing.expected_seconds): tables and properties."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnout.core.placement import PlacementRules
from turnout.core.routing import Demand, Route, WorkerView, expected_seconds, neutral_of, route
from turnout.core.sharing import MAX_SHARING, MIN_SPREAD, Company, fitted, full_speed, level, overlap, throughput

M = "m"
LOADED = frozenset({M})
# 100 prompt tokens at the default 300/s, 30 completion tokens at the default 30/s: 1.33 s of work alone
ASK = Demand(prompt_bytes=400, output_tokens=30)


def w(name: str, **kw: object) -> WorkerView:
    base = WorkerView(name=name, healthy=True, rules=PlacementRules(), inventory=LOADED, loaded=LOADED)
    return base._replace(**kw)


def first(workers: list[WorkerView], demand: Demand = ASK) -> str:
    decision = route(M, workers, demand=demand)
    assert isinstance(decision, Route), decision
    return decision.best.worker


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        ((0.0, 100.0), (1.0, 50.0), 1.0),  # half the speed beside one other: time-sharing
        ((0.0, 100.0), (3.0, 100.0), 0.0),  # the same speed beside three: batching for free
        ((0.0, 100.0), (3.0, 40.0), 0.5),  # 2.5x slower beside three
        ((1.0, 50.0), (3.0, 25.0), 1.0),  # never alone: 1 and 3 beside, time-shared (alone it would do 100)
        ((1.0, 80.0), (3.0, 60.0), 0.2),  # never alone: 96 / 1.2 and 96 / 1.6 (alone 96, s 0.2)
        ((0.0, 100.0), (1.0, 25.0), MAX_SHARING),  # four times slower beside one: kept at the bound
        ((1.0, 100.0), (2.0, 10.0), MAX_SHARING),  # more than the model allows: the bound
        ((0.0, 100.0), (1.0, 200.0), 0.0),  # faster together (noise): never below 0
        ((0.0, 100.0), (0.4, 50.0), None),  # too close in company to tell
        ((0.0, 0.0), (1.0, 50.0), None),  # a level without a rate is left out: one left
    ],
)
def test_what_two_levels_of_company_say(
    lo: tuple[float, float], hi: tuple[float, float], expected: float | None
) -> None:
    got = fitted([Company(*lo, 1), Company(*hi, 1)])
    assert got == (None if expected is None else pytest.approx(expected))


@given(st.floats(1, 1000), st.floats(0, 2), st.lists(st.tuples(st.floats(0, 6), st.integers(1, 20)), min_size=2))
def test_the_fit_recovers_the_sharing_that_made_the_rates(
    alone: float, sharing: float, levels: list[tuple[float, int]]
) -> None:
    company = [Company(b, alone / (1 + sharing * b), n) for b, n in levels]
    spread = max(b for b, _ in levels) - min(b for b, _ in levels)
    got = fitted(company)
    if spread < MIN_SPREAD:
        assert got is None
    else:
        assert got == pytest.approx(sharing, abs=1e-6)


def test_a_level_of_one_odd_answer_weighs_less_than_levels_of_many() -> None:
    """Levels 0 and 1 (twenty answers each) say time-shared; one odd answer at level 3 says nearly free. The least
    and the most company alone would say 0.08; the fit, weighted by answers, stays nearer the many."""
    levels = [Company(0.0, 100.0, 20), Company(1.0, 50.0, 20), Company(3.0, 80.0, 1)]
    got = fitted(levels)
    assert got is not None and got > 0.4
    assert fitted([levels[0], levels[2]]) == pytest.approx(0.0833, abs=0.001)


@pytest.mark.parametrize(
    ("slots", "sharing", "expected"),
    [
        (4, None, 4),  # not learned: its slots
        (4, 0.0, 4),  # batching for free
        (4, 0.05, 3),  # nearly: 3.5 rounds to 3 (half to even: 3.48)
        (4, 1.0, 1),  # time-shared: one at full speed
        (4, 1.66, 1),  # slower together than in turn: still one
        (4, 0.5, 2),  # 1.6 requests' worth
        (1, 1.0, 1),
        (None, 1.0, None),  # a batching engine of unknown capacity: unknown
    ],
)
def test_what_an_engine_gets_through_at_full_speed(slots: int | None, sharing: float | None, expected: int) -> None:
    assert full_speed(slots, sharing) == expected


def test_answers_are_filed_by_their_nearest_level_of_company() -> None:
    assert [level(b) for b in (0.0, 0.49, 0.5, 1.4, 2.6, -1.0)] == [0, 0, 1, 1, 3, 0]
    assert MIN_SPREAD == 0.5


@given(st.integers(1, 64), st.floats(0, 10))
def test_throughput_is_between_one_and_the_slots(slots: int, sharing: float) -> None:
    value = throughput(slots, sharing)
    assert slots / (1 + MAX_SHARING * (slots - 1)) - 1e-9 <= value <= slots + 1e-9
    assert throughput(slots, 0.0) == slots
    assert throughput(slots, 1.0) == pytest.approx(1.0)
    assert throughput(1, sharing) == 1.0


@given(st.floats(0, 2), st.floats(0, 100), st.integers(0, 8), st.floats(0, 100))
@settings(max_examples=300)
def test_overlap_is_at_most_their_work_and_its_own_per_request(
    sharing: float, left: float, others: int, own: float
) -> None:
    extra = overlap(sharing, left, others, own)
    assert 0.0 <= extra <= sharing * left + 1e-9
    assert extra <= sharing * others * own + 1e-9
    assert overlap(0.0, left, others, own) == 0.0
    assert overlap(sharing, left, 0, own) == 0.0


def test_time_sharing_two_jobs_matches_the_processor_sharing_finish() -> None:
    """Two jobs on one time-shared engine, one with 3 s left and a new one of 1 s: the new one ends at 2 s (each at
    half speed for 2 s); with 0.5 s left it ends at 1.5 s (half speed for 1 s, then alone)."""
    assert 1.0 + overlap(1.0, 3.0, 1, 1.0) == pytest.approx(2.0)
    assert 1.0 + overlap(1.0, 0.5, 1, 1.0) == pytest.approx(1.5)


# -- routing: a free slot beside requests at work is not a free engine ------------------------------------------


def test_an_idle_engine_goes_before_one_at_work_with_a_free_slot() -> None:
    """Four-slot engines, nothing learned (taken to share their speed): the one running a request has a free slot,
    but its speed is shared, so the idle one is quicker."""
    busy = w("a", slots=4, in_flight=1, ranked=1, backlog_s=2.0)
    assert first([busy, w("b", slots=4)]) == "b"
    assert first([w("b", slots=4), busy]) == "b"


def test_an_engine_that_batches_for_free_is_as_quick_with_a_free_slot() -> None:
    """Learned sharing 0 on both: a request at work costs the newcomer nothing; the held prefix decides."""
    busy = w("a", slots=4, in_flight=3, ranked=3, backlog_s=6.0, sharing=0.0, cached=200)
    assert first([busy, w("b", slots=4, sharing=0.0)]) == "a"


def test_a_held_prefix_still_wins_beside_a_short_request() -> None:
    """What it holds saves more than the overlap with a request nearly done costs."""
    long_prompt = Demand(prompt_bytes=40_000, output_tokens=4)  # 10,000 tokens: 33 s cold at 300/s
    holder = w("a", slots=4, in_flight=1, ranked=1, backlog_s=0.5, cached=39_000)
    assert first([holder, w("b", slots=4)], long_prompt) == "a"


def test_the_queue_of_a_time_shared_engine_drains_one_request_at_a_time() -> None:
    """Every slot busy: with the speed shared, four requests of 1 s ahead are 4 s of wait, not 1 s."""
    neutral_shared = neutral_of([w("x", slots=4, sharing=1.0)])
    neutral_free = neutral_of([w("x", slots=4, sharing=0.0)])
    full = w("a", slots=4, in_flight=4, ranked=4, backlog_s=4.0)
    shared = expected_seconds(full, M, ASK, neutral_shared)
    free = expected_seconds(full, M, ASK, neutral_free)
    assert shared.queued and free.queued
    work = free.work
    assert free.own == pytest.approx(work + 1.0)
    assert shared.own == pytest.approx(work + 4.0 + 3 * work)


def test_unlearned_engines_take_the_mean_of_those_learned() -> None:
    views = [w("a", slots=4, sharing=0.2), w("b", slots=4, sharing=0.4), w("c", slots=4), w("d", slots=1, sharing=2)]
    assert neutral_of(views).sharing == pytest.approx(0.3)  # a one-slot engine's figure is not sharing
    assert neutral_of([w("a", slots=4)]).sharing == 1.0


@given(st.integers(2, 8), st.integers(1, 7), st.floats(0, 2), st.floats(0, 50), st.floats(0, 50))
@settings(max_examples=300)
def test_more_at_work_never_makes_an_engine_quicker(
    slots: int, in_flight: int, sharing: float, backlog: float, busy: float
) -> None:
    """One more request in flight (its work added to the backlog) never lowers the expected time, free or queued."""
    neutral = neutral_of([w("x", slots=slots, sharing=sharing)])
    view = w("a", slots=slots, in_flight=in_flight, ranked=in_flight, backlog_s=backlog, busy_s=busy)
    more = view._replace(in_flight=in_flight + 1, ranked=in_flight + 1, backlog_s=backlog + 1.0)
    assert expected_seconds(more, M, ASK, neutral).own >= expected_seconds(view, M, ASK, neutral).own - 1e-9
