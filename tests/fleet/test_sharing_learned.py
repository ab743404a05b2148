"""How much an engine's requests slow each other, learned from answers (turnout.fleet.state.Learned and
WorkerState.flown, read by turnout.gateway.dispatch.Lease.beside); the rule itself is turnout.core.sharing's
(tests/core/test_sharing.py)."""

import pytest

from turnout.config import Worker
from turnout.core.signals import Sample
from turnout.fleet.state import Learned, WorkerState

TTL = 300.0


def answer(rate: float) -> Sample:
    """An answer whose engine timings say it generated at ``rate`` tokens/s after the first."""
    return Sample(decode_tokens=100, decode_s=100 / rate)


def test_answers_alone_and_beside_others_teach_the_sharing() -> None:
    learned = Learned()
    learned.learn(answer(100.0), 1.0, TTL, beside=0.0)
    assert learned.fresh_sharing(1.0, TTL) is None  # one level of company: nothing to compare
    learned.learn(answer(50.0), 2.0, TTL, beside=1.0)  # half the speed beside one: time-shared
    assert learned.fresh_sharing(2.0, TTL) == pytest.approx(1.0)
    for t in range(3, 40):  # then it runs them as fast together: the figure follows
        learned.learn(answer(100.0), float(t), TTL, beside=1.0)
    assert learned.fresh_sharing(40.0, TTL) == pytest.approx(0.0, abs=0.01)
    assert learned.decode is not None  # the decode rate is learned from every answer, as before


def test_an_engine_never_alone_learns_it_too() -> None:
    """Under constant load: answers beside one and beside three others, at 100 / (1 + 0.5 b)."""
    learned = Learned()
    for t in range(10):
        learned.learn(answer(100 / 1.5), float(t), TTL, beside=1.0)
        learned.learn(answer(100 / 2.5), float(t), TTL, beside=3.0)
    assert learned.fresh_sharing(10.0, TTL) == pytest.approx(0.5)


def test_company_too_close_to_tell_teaches_nothing() -> None:
    learned = Learned()
    learned.learn(answer(100.0), 1.0, TTL, beside=0.0)
    learned.learn(answer(10.0), 2.0, TTL, beside=0.4)  # filed with the answers alone
    assert learned.fresh_sharing(2.0, TTL) is None


def test_no_company_known_teaches_no_sharing() -> None:
    learned = Learned()
    learned.learn(answer(100.0), 1.0, TTL)
    learned.learn(answer(50.0), 2.0, TTL)
    assert not learned.company and learned.fresh_sharing(2.0, TTL) is None


def test_sharing_goes_stale_with_the_rates() -> None:
    learned = Learned()
    learned.learn(answer(100.0), 0.0, TTL, beside=0.0)
    learned.learn(answer(50.0), 1.0, TTL, beside=1.0)
    assert learned.fresh_sharing(TTL, TTL) == pytest.approx(1.0)
    assert learned.fresh_sharing(0.5 + TTL, TTL) is None  # the answer alone is stale: one level left
    # a stale level starts again from the next answer there, not smoothed with the old figure
    learned.learn(answer(25.0), 2.0 + TTL, TTL, beside=0.0)
    learned.learn(answer(25.0), 2.0 + TTL, TTL, beside=1.0)
    assert learned.fresh_sharing(2.0 + TTL, TTL) == pytest.approx(0.0)


def test_requests_in_flight_integrated_over_time() -> None:
    state = WorkerState(Worker(name="w", url="http://127.0.0.1:1"))
    assert state.flown(10.0) == 0.0
    state.in_flight = 1
    start = state.flown(10.0)
    state.flown(12.0)
    state.in_flight = 3  # two more from 12 s
    state.flown(14.0)
    state.in_flight = 1
    # from 10 to 16 s: 1 for 2 s, 3 for 2 s, 1 for 2 s: a mean of 5/3
    assert (state.flown(16.0) - start) / 6.0 == pytest.approx(10 / 6)
    assert state.flown(15.0) == state.flown(16.0)  # an earlier reading never takes any back


def test_an_answers_company_counts_the_other_processes_requests_too() -> None:
    """This process's requests as they came and went, and the other processes' (their keeper's count when it was
    sent, less this process's) taken to stay for the answer's time."""
    from turnout.gateway.dispatch import Lease

    state = WorkerState(Worker(name="w", url="http://127.0.0.1:1"))
    flown = state.flown(10.0)
    state.in_flight = 1
    lease = Lease(state, "m", "m", "t", None, sent_at=10.0, flown=flown, elsewhere=2)  # type: ignore[arg-type]
    state.flown(11.0)
    state.in_flight = 2  # another of this process's for the second half
    assert lease.beside(12.0) == pytest.approx(0.5 + 2)
    assert lease.beside(10.0) is None
