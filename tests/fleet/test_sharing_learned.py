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


def test_alone_answers_teach_the_alone_rate_and_shared_ones_the_sharing() -> None:
    learned = Learned()
    learned.learn(answer(50.0), 1.0, TTL, beside=0.5)  # beside others before any alone rate: teaches nothing
    assert learned.sharing is None and learned.alone is None
    learned.learn(answer(100.0), 2.0, TTL, beside=0.0)
    assert learned.alone == pytest.approx(100.0) and learned.sharing is None
    learned.learn(answer(50.0), 3.0, TTL, beside=1.0)  # half the speed beside one: time-shared
    assert learned.fresh_sharing(3.0, TTL) == pytest.approx(1.0)
    for t in range(4, 40):  # then it batches for free: the figure follows
        learned.learn(answer(100.0), float(t), TTL, beside=3.0)
    assert learned.fresh_sharing(40.0, TTL) == pytest.approx(0.0, abs=0.01)
    assert learned.decode is not None  # the decode rate is learned from every answer, as before


def test_a_mostly_alone_answer_teaches_neither() -> None:
    learned = Learned()
    learned.learn(answer(100.0), 1.0, TTL, beside=0.0)
    learned.learn(answer(10.0), 2.0, TTL, beside=0.4)
    assert learned.alone == pytest.approx(100.0) and learned.sharing is None


def test_no_company_known_teaches_no_sharing() -> None:
    learned = Learned()
    learned.learn(answer(100.0), 1.0, TTL)
    assert learned.alone is None and learned.sharing is None


def test_sharing_goes_stale_with_the_rates() -> None:
    learned = Learned()
    learned.learn(answer(100.0), 0.0, TTL, beside=0.0)
    learned.learn(answer(50.0), 1.0, TTL, beside=1.0)
    assert learned.fresh_sharing(1.0 + TTL, TTL) == pytest.approx(1.0)
    assert learned.fresh_sharing(2.0 + TTL, TTL) is None
    # a stale alone rate teaches nothing: the next shared answer waits for a fresh one
    learned.learn(answer(10.0), 2.0 + TTL, TTL, beside=1.0)
    assert learned.fresh_sharing(2.0 + TTL, TTL) is None


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
