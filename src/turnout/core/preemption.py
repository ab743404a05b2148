"""Preemption: which running batch request a waiting request of a higher class stops, decided once, here.

Headroom (:mod:`turnout.core.headroom`) keeps batch requests off some slots beforehand; it cannot keep every
interactive request from finding every slot taken (three clients on three one-slot engines, one of them running a
batch line: bench/batch_fleet.py, waited p90 0.02 -> 0.21 s). Then the only way to start it at once is to stop a
batch request that holds a slot it could use:

- only a request that is not ``batch`` itself stops one (:data:`PREEMPTORS`), and only when it waits for a slot a
  running request holds: in the gateway's queue (:data:`SLOT_HELD`: every worker busy, the gateway's or the model's
  cap), never for its tenant's cap or behind another waiter (stopping a batch request would not start it); or, on
  engines with no cap in the gateway, in the engine's own queue, when every worker that may serve it runs as many
  requests as its engine runs at once (the dispatcher then ranks the workers as if their batch requests were
  stopped, and stops one where the request goes: ``why`` is ``worker`` and ``workers`` that one);
- the batch request stopped is one of the same model, on a worker this request may be sent to, that may be stopped
  (:func:`may_stop`: each Batch API line is stopped at most :data:`STOPS_MOST` times, so a batch always
  progresses and the work thrown away is at most that many partial answers per line), the one that started last
  (the least work lost: a line stopped and sent again is often that one, and has lost little each time), of those
  whose answer has begun (:attr:`Running.answering`): a line still in its prefill frees its slot only once the
  prefill ends (llama.cpp decodes a prompt batch uninterrupted), and the line just sent again is often there; of
  those in their prefill only when none has begun;
- each waiting request stops at most one (the slot it frees wakes the queue's first waiter, which a request of a
  higher class is: :func:`turnout.core.admission.queue_score`).

Pure: no I/O, no clock (times are parameters).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import NamedTuple

from turnout.core.admission import Priority

__all__ = ["PREEMPTORS", "SLOT_HELD", "STOPS_MOST", "Running", "may_stop", "victim"]

PREEMPTORS = frozenset({Priority.INTERACTIVE, Priority.STANDARD})
# Why a request waits (the dispatcher's refusal counts, :func:`turnout.core.admission.refusal`, and the router's
# saturation) when what it waits for is a slot a running request holds.
SLOT_HELD = frozenset({"worker", "model", "total", "saturated"})
# How often one line may be stopped. Once was the first bound: under a busy interactive load nearly every line was
# stopped once, ran again unstoppable, and later interactive requests waited behind those (bench/batch_fleet.py,
# batch_share 1: waited p90 0.71 s, run E). A stopped line is sent again behind the request that stopped it, so it
# is then the line that started last, the next one stopped, having lost only what it did since: three stops waste
# at most three partial answers per line, then it runs to its end.
STOPS_MOST = 3


def may_stop(stops: int) -> bool:
    """Whether a line stopped ``stops`` times already may be stopped again for a request of a higher class."""
    return stops < STOPS_MOST


class Running(NamedTuple):
    """A batch request in flight that may be stopped (in this process, or in another process or replica that offers
    it): its lease, worker, model (as requested), when it took its slot (this process's monotonic seconds) and the
    work its router expected of it there (seconds; None: not ranked)."""

    lease: str
    worker: str
    model: str
    since: float
    work: float | None = None
    # its answer has begun (the engine is past its prefill; unknown, another process's: taken as begun). A request
    # in its prefill frees its slot only once the prefill ends (llama.cpp decodes a prompt batch uninterrupted)
    answering: bool = True


def victim(
    running: Iterable[Running], priority: Priority, why: str, model: str, workers: Collection[str]
) -> Running | None:
    """The batch request a request of ``priority`` for ``model``, waiting because ``why``, stops (None: none).
    ``workers``: those it may be sent to (placement's candidates less those it already failed on)."""
    if priority not in PREEMPTORS or why not in SLOT_HELD:
        return None
    best: Running | None = None
    for run in running:
        if run.model != model or run.worker not in workers:
            continue
        if best is None or (run.answering, run.since, run.lease) > (best.answering, best.since, best.lease):
            best = run
    return best
