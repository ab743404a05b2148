"""A request's phases as recorded (:mod:`turnout.gateway.timing`): the header each set of phases gives, a hold
inside the queue's wait, the held gauge, the bounded model labels, and the W3C trace context passed to workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnout.config import Settings, Worker
from turnout.fleet.state import Fleet, WorkerState
from turnout.gateway.timing import Holding, Phases, model_label, unrouted_label
from turnout.gateway.trace_context import passed_on, valid_traceparent
from turnout.metrics import Metrics
from turnout.phase_stats import OTHER_MODEL
from turnout.state.placement_store import PlacementStore


def _phases(
    queue: tuple[float, float] | None = None,
    holds: list[tuple[float, float]] | None = None,
    connect: float | None = None,
    sent: float = 0.0,
    first: float = 0.0,
) -> Phases:
    phases = Phases(100.0)
    for start, end in holds or ():
        phases.held(start, end)
    if queue is not None:
        phases.queued(queue[0], queue[1], 0.0)
    if connect is not None:
        phases.connected(connect, sent)
    if first:
        phases.first_byte(first)
    return phases


@pytest.mark.parametrize(
    ("phases", "now", "header"),
    [
        # a refused request: only its total
        (_phases(), 100.25, "total;dur=250.0"),
        # routed nowhere: it asked for a slot
        (_phases(queue=(100.0, 100.0001)), 100.001, "queue;dur=0.1, total;dur=1.0"),
        # the usual proxied answer
        (
            _phases(queue=(100.0, 100.001), connect=0.0, sent=100.0012, first=100.5),
            100.6,
            "queue;dur=1.0, upstream;dur=0.0, ttft;dur=498.8, total;dur=600.0",
        ),
        # the most usual: no wait, a kept-alive connection (each under a twentieth of a millisecond)
        (
            _phases(queue=(100.0, 100.00004), connect=0.000049, sent=100.0001, first=100.2),
            100.25,
            "queue;dur=0.0, upstream;dur=0.0, ttft;dur=199.9, total;dur=250.0",
        ),
        # ... and one just over: 0.05 ms reads 0.1
        (
            _phases(queue=(100.0, 100.00005), connect=0.0, sent=100.0001, first=100.2),
            100.25,
            "queue;dur=0.1, upstream;dur=0.0, ttft;dur=199.9, total;dur=250.0",
        ),
        # held 2 s inside its wait for a slot: the hold is not queue time
        (
            _phases(queue=(100.0, 102.5), holds=[(100.1, 102.1)], connect=0.003, sent=102.503, first=103.0),
            103.2,
            "queue;dur=500.0, hold;dur=2000.0, upstream;dur=3.0, ttft;dur=497.0, total;dur=3200.0",
        ),
        # a stream's header sent before anything ended (its headers sent early, while it is held): nothing to tell,
        # and the proxy sends no Server-Timing then
        (_phases(), None, ""),
        # a stream's header, sent before its body: no first byte, no total
        (_phases(queue=(100.0, 100.002), connect=0.0004, sent=100.003), None, "queue;dur=2.0, upstream;dur=0.4"),
    ],
)
def test_the_header_tells_each_phase_gone_through(phases: Phases, now: float | None, header: str) -> None:
    assert phases.header(now) == header


def test_a_worker_that_could_not_be_reached_counts_in_upstream_and_the_next_one_in_ttft() -> None:
    phases = Phases(10.0)
    phases.queued(10.0, 10.001, 0.0)
    phases.connect_failed(0.5)  # refused after half a second
    phases.queued(10.5, 10.501, 0.0)
    phases.connected(0.01, 10.52)
    phases.first_byte(10.6)
    phases.first_byte(10.9)  # (only the first counts)
    assert phases.header(11.0) == "queue;dur=2.0, upstream;dur=510.0, ttft;dur=80.0, total;dur=1000.0"


async def test_holding_counts_in_the_gauge_and_the_hold_phase_however_it_ends() -> None:
    metrics = Metrics(_fleet([]))
    phases = Phases(0.0)
    with Holding(phases, metrics):
        assert metrics.requests_held == 1
        with Holding(None, metrics):  # (a hold outside a client request: the gauge only)
            assert metrics.requests_held == 2
    assert metrics.requests_held == 0 and phases.holds is not None and len(phases.holds) == 1
    with pytest.raises(TimeoutError), Holding(phases, metrics):
        raise TimeoutError  # a hold that ran out
    assert metrics.requests_held == 0 and len(phases.holds) == 2
    assert "turnout_held_requests 0.0" in metrics.render().decode()


def test_a_hold_inside_the_wait_for_a_slot_is_taken_out_of_the_queue_phase() -> None:
    """What the proxy does around ``Dispatcher.acquire``: the hold recorded before it, the wait, the hold after."""
    phases = Phases(0.0)
    held = phases.hold
    phases.held(1.0, 4.0)  # a wake, inside the wait
    phases.queued(0.5, 4.5, held)
    assert phases.queue == pytest.approx(1.0) and phases.hold == pytest.approx(3.0)


def _fleet(workers: list[Worker]) -> Fleet:
    return Fleet(Settings(workers=workers), PlacementStore(Path("/nonexistent/model-placement.json")))


def _worker(name: str, inventory: frozenset[str] | None, claim: str | None = None) -> WorkerState:
    state = WorkerState(Worker(name=name, url="http://127.0.0.1:1"))  # type: ignore[arg-type]
    state.inventory = inventory
    state.claim = claim
    return state


@pytest.mark.parametrize(
    ("inventory", "claim", "model", "label"),
    [
        (frozenset({"llama3:latest"}), None, "llama3:latest", "llama3:latest"),
        (None, None, "anything-a-client-writes", OTHER_MODEL),  # inventory unknown: sent any name (fail-open)
        (frozenset({"llama3:latest"}), None, "qwen", OTHER_MODEL),
        (None, "tinyv", "tinyv", "tinyv"),  # a claim's engine serves its one model
    ],
)
def test_model_labels_are_the_fleets_models(
    inventory: frozenset[str] | None, claim: str | None, model: str, label: str
) -> None:
    assert model_label(_worker("w", inventory, claim), model) == label


def test_a_request_that_got_no_worker_is_labelled_by_an_inventory_that_lists_its_model() -> None:
    fleet = _fleet([])
    fleet.workers = {"a": _worker("a", None), "b": _worker("b", frozenset({"gemma4:latest"}))}
    assert unrouted_label(fleet, "gemma4") == "gemma4:latest"  # Ollama's other spelling
    assert unrouted_label(fleet, "made-up") == OTHER_MODEL
    fleet.bindings = {"tinyv": _worker("c", None, "tinyv")}
    assert unrouted_label(fleet, "tinyv") == "tinyv"


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", True),  # the spec's own example
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", True),  # not sampled: still a context
        ("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-later", True),  # a later version may add fields
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-later", False),  # ... version 00 may not
        ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", False),  # version ff is invalid
        ("00-00000000000000000000000000000000-b7ad6b7169203331-01", False),  # all-zero trace id
        ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", False),  # all-zero parent id
        ("00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", False),  # upper-case hex
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01", False),  # a digit short
        ("", False),
        ("garbage", False),
    ],
)
def test_traceparents_as_the_w3c_grammar_reads_them(value: str, valid: bool) -> None:
    assert valid_traceparent(value) is valid


def test_the_clients_trace_context_goes_on_only_with_a_valid_traceparent() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert passed_on({}) is None
    assert passed_on({"tracestate": "a=1"}) is None  # a tracestate alone means nothing
    assert passed_on({"traceparent": "junk", "tracestate": "a=1"}) is None
    assert passed_on({"traceparent": parent}) == {"traceparent": parent}
    assert passed_on({"traceparent": parent, "tracestate": "a=1"}) == {"traceparent": parent, "tracestate": "a=1"}
    assert passed_on({"traceparent": parent, "tracestate": "a" * 600}) == {"traceparent": parent}  # too long
