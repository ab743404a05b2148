"""Admission: whether a request may take a slot now, and who goes first among those that wait.

One set of rules, whichever keeps the counts: one process in memory, the supervisor of ``turnout serve --workers
N``, or Redis for any number of replicas (its Lua scripts follow these functions; tests run the same tables
against every keeper).

**Caps** (:func:`refusal`): a request takes one unit of every count it belongs to (all requests, its model, its
tenant, its worker, and, for a batch request, the batch requests on its worker and those of its model on every
worker); each count with a cap must be under it. What batch requests may hold is
:mod:`turnout.core.headroom`'s.

**The queue** is ordered by a score (:func:`queue_score`): the priority class first (``interactive`` before
``standard`` before ``batch``; a batch request that has waited :data:`BATCH_AGEING_S` is served as a standard one,
so batch never starves), then, within a class, weighted fair queueing between tenants (:func:`fair_tag`, start-time
fair queueing): a tenant's next request is tagged one over its weight past the later of its own last tag in that
class and the class's virtual time (the tag of the last request of the class that left the queue). Each class keeps
its own tags: a tenant's waiting batch requests never put its interactive ones behind later interactive ones of
other tenants. Tenants that keep requests waiting are
served in proportion to their weights; one that arrives later is not put behind another's whole burst; within a
tenant, first come first served. The first waiter whose tenant is under its cap goes first (:func:`first`).

Pure: no clock (times and counts are parameters), no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import NamedTuple

__all__ = [
    "BATCH_AGEING_S",
    "CLASS_BAND",
    "Caps",
    "Counts",
    "Priority",
    "Waiter",
    "fair_tag",
    "first",
    "moved",
    "queue_score",
    "refusal",
    "served_as",
]

# A class's scores lie in a band of this width (a tag grows by at most 1 per request: a billion requests per band).
CLASS_BAND = 1e9
# A batch request waiting this long is served as a standard one: batch never starves (a long generation of another
# class ends within minutes; ten of them is an upper bound on what a batch line waits while capacity is used).
BATCH_AGEING_S = 600.0


class Priority(StrEnum):
    INTERACTIVE = "interactive"
    STANDARD = "standard"
    BATCH = "batch"

    @property
    def rank(self) -> int:
        return _RANKS[self]


_RANKS = {Priority.INTERACTIVE: 0, Priority.STANDARD: 1, Priority.BATCH: 2}


class Counts(NamedTuple):
    """Requests in flight that a new one would join: all, its model's, its tenant's, its worker's, its worker's
    batch requests, and its model's batch requests."""

    total: int = 0
    model: int = 0
    tenant: int = 0
    worker: int = 0
    worker_batch: int = 0
    model_batch: int = 0


class Caps(NamedTuple):
    """The caps of those counts (None: none). ``worker_batch``/``model_batch``: how many of a worker's slots, and of
    all the model's workers' slots, batch requests may hold (None for a request that is not a batch request)."""

    total: int | None = None
    model: int | None = None
    tenant: int | None = None
    worker: int | None = None
    worker_batch: int | None = None
    model_batch: int | None = None


def refusal(counts: Counts, caps: Caps) -> str | None:
    """The first count at its cap (``total``, ``model``, ``tenant``, ``worker``, ``worker_batch``, ``model_batch``), or
    None: it may take a slot."""
    for name, count, cap in zip(Caps._fields, counts, caps, strict=True):
        if cap is not None and count >= cap:
            return name
    return None


def moved(seen: int | None, count: int) -> bool:
    """Whether a worker took requests since its router counted ``seen`` of them in flight there: the decision was
    made on counts that no longer hold (another replica's take, or another of this replica's, landed between the
    view and the take), so it is made again on the new ones. None: nothing was ranked (one candidate)."""
    return seen is not None and count > seen


def fair_tag(last: float | None, virtual: float, weight: int) -> float:
    """A tenant's next tag: one over its weight past the later of its last tag and the queue's virtual time."""
    return max(last or 0.0, virtual) + 1.0 / max(weight, 1)


def served_as(priority: Priority, waited_s: float) -> Priority:
    """The class a request that has waited ``waited_s`` is served as: a batch request that has waited
    :data:`BATCH_AGEING_S`, a standard one (its place in the queue, and no batch headroom holds it back: at the head
    of the queue it would otherwise keep standard requests from a free slot)."""
    if priority is Priority.BATCH and waited_s >= BATCH_AGEING_S:
        return Priority.STANDARD
    return priority


def queue_score(priority: Priority, tag: float, waited_s: float) -> float:
    """Where a waiter stands: the band of the class it is served as (:func:`served_as`), then its tag."""
    return served_as(priority, waited_s).rank * CLASS_BAND + tag


class Waiter(NamedTuple):
    id: str
    tenant: str
    score: float


def first(waiters: Iterable[Waiter], can_go: Mapping[str, bool]) -> Waiter | None:
    """The waiter that goes first: the lowest score among those whose tenant is under its cap (``can_go``; a tenant
    not in it may go)."""
    best: Waiter | None = None
    for waiter in waiters:
        if can_go.get(waiter.tenant, True) and (best is None or waiter.score < best.score):
            best = waiter
    return best
