"""Occupancy: the requests in flight (per worker, model, tenant, and in all) and the requests waiting for a slot,
kept where every gateway process that routes to the same workers sees them.

The dispatcher asks an :class:`Occupancy` three things per request: what is held (:meth:`Occupancy.view`: the
counts, what each candidate worker holds of the prompt, and whether a waiter is ahead of this request), to take a
slot (:meth:`Occupancy.take`: atomic against every cap, :func:`turnout.core.admission.refusal`, and against the
queue's order, so a newcomer never overtakes a waiter that can go), and to give it back
(:meth:`Occupancy.give`). A request that cannot go waits (:meth:`Occupancy.wait`) in one queue per model, ordered by
:func:`turnout.core.admission.queue_score` (priority class, then weighted fair queueing between tenants); a slot
given back wakes the first waiters, which route again.

Keepers:

- :class:`LocalOccupancy` (this module): one process's memory. A single `turnout serve` uses it, and so does the
  supervisor of `turnout serve --workers N` for all its processes (:mod:`turnout.gateway.supervised`);
- Redis (:mod:`turnout.gateway.redis_occupancy`), for any number of replicas, with a :class:`LocalOccupancy` as its
  fallback while Redis cannot be reached.

The prefix index each worker's view reports comes from the fleet's own indexes here (``Fleet.workers[w].prefix``);
the Redis keeper keeps one index per worker for every replica.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple, Protocol

from turnout.core.admission import Caps, Counts, Priority, Waiter, fair_tag, first, moved, queue_score, refusal
from turnout.core.preemption import Running
from turnout.core.prefix import Match, Prompt
from turnout.core.routing import NO_BACKLOG, Backlog

__all__ = ["Grant", "Held", "LocalOccupancy", "Occupancy", "Ticket", "woken"]


class Held(NamedTuple):
    """What is held when a request is routed: every keeper's counts (this process's included). ``backlogs``: what
    the workers' requests in flight are expected to take, where the keeper knows every replica's (none: the fleet's
    own figures, this process's requests)."""

    total: int
    model: int
    tenant: int
    workers: Mapping[str, int]  # requests in flight per candidate worker
    matches: Mapping[str, Match]  # what each candidate worker is expected to hold of the prompt (none: empty)
    ahead: bool  # a waiter for this model that can go now is ahead of this request
    backlogs: Mapping[str, Backlog] = MappingProxyType({})
    model_batch: int = 0  # of ``model``, the batch requests
    # the batch requests for ``model`` on these workers that other processes (of any replica) offer to stop
    # (:meth:`Occupancy.offer`; ``since`` in this process's monotonic seconds); this process's own are its dispatcher's
    stoppable: tuple[Running, ...] = ()


class Grant(NamedTuple):
    """A slot to take: its id, where, for what (the model as requested), whose, its class and caps, the prompt to
    record in the worker's prefix index, the ticket it waited with (None: it did not wait), the work its router
    expected of it there (seconds; None: not ranked, a single candidate), and the worker's requests in flight its
    router saw (None: nothing to check; more now: refused ``moved``, :func:`turnout.core.admission.moved`)."""

    lease: str
    worker: str
    model: str
    tenant: str
    priority: Priority
    caps: Caps
    prompt: Prompt | None
    ticket: Ticket | None = None
    work: float | None = None
    seen: int | None = None


@dataclass(eq=False, slots=True)
class Ticket:
    """One request's place in a model's queue (kept while it routes again after a wake)."""

    id: str
    model: str
    tenant: str
    priority: Priority
    tag: float
    since: float  # when it joined the queue (monotonic seconds)
    woken: asyncio.Event = field(default_factory=asyncio.Event)

    def waiter(self, now: float) -> Waiter:
        return Waiter(self.id, self.tenant, queue_score(self.priority, self.tag, now - self.since))


class Occupancy(Protocol):
    async def view(
        self,
        model: str,
        tenant: str,
        workers: Sequence[str],
        prompt: Prompt | None,
        ticket: Ticket | None,
        slots: Mapping[str, int | None],
        *,
        offers: bool = True,
    ) -> Held:
        """What is held on ``workers`` (:class:`Held`); ``offers`` False: the batch requests other processes offer to
        stop are not read (a request that may stop none)."""
        ...

    async def take(self, grant: Grant) -> str | None:
        """Take the slot: None, or why not (``moved``: the worker took requests since the view; ``total``, ``model``,
        ``tenant``, ``worker``, ``worker_batch``, ``model_batch``: that count is at its cap; ``ahead``: a waiter that
        can go is ahead of it)."""
        ...

    def give(self, grant: Grant) -> None:
        """The request ended: its slot is free (and an offer to stop it withdrawn)."""
        ...

    def offer(self, grant: Grant, since: float, on_stop: Callable[[], None]) -> None:
        """This process's batch request (``grant``, which took its slot at ``since``, monotonic seconds) may be
        stopped by a request of a higher class that another process or replica routes: it is in their views
        (:attr:`Held.stoppable`) until its slot is given back, and ``on_stop`` is called (at most once) when one of
        them stops it (:meth:`stop`). Nothing where no other process routes to the same workers."""
        ...

    async def stop(self, line: Running) -> bool:
        """Stop another process's batch request (one of :attr:`Held.stoppable`): True when this call stopped it,
        False when it is no longer offered (given back, or another request stopped it first)."""
        ...

    async def settle(self) -> None:
        """Until the slots given back so far count as free for every replica (a Redis round trip; nothing here):
        awaited before a non-streamed answer goes out, so that the client's next request, on any replica, finds
        the worker that answered it free."""
        ...

    @property
    def remote(self) -> bool:
        """Counts live elsewhere (a view costs a round trip): a request with a single candidate worker takes its slot
        without one, the take checking every cap."""
        ...

    async def join(self, model: str, tenant: str, weight: int, priority: Priority, max_queue: int) -> Ticket | None:
        """A place in ``model``'s queue; None when ``max_queue`` requests already wait (every keeper's)."""
        ...

    async def wait(self, ticket: Ticket, limit_s: float) -> bool:
        """Until a slot may be free for ``ticket`` (True) or ``limit_s`` passed (False)."""
        ...

    def leave(self, ticket: Ticket) -> None: ...

    def wake_all(self) -> None:
        """The fleet changed (a worker came up, rules changed): every queue's first waiters route again."""
        ...

    @property
    def waiting(self) -> int: ...


_ids = itertools.count(1)


def _new_origin() -> str:
    return secrets.token_hex(4)


# what makes this process's ids its own among every replica's and process's (they meet in Redis and in the
# supervisor's counts): drawn again in a forked child
_origin = _new_origin()


def _forked() -> None:
    global _origin
    _origin = _new_origin()


os.register_at_fork(after_in_child=_forked)


def next_id(prefix: str) -> str:
    """An id no other process of any replica makes (a lease or a ticket: two replicas' ``l7`` were one lease in
    Redis, and a worker's cap let a request more through)."""
    return f"{prefix}{_origin}.{next(_ids)}"


class _Queue:
    """One model's waiters and its fair-queueing state."""

    __slots__ = ("last", "tickets", "virtual")

    def __init__(self) -> None:
        self.tickets: dict[str, Ticket] = {}
        # per class (its rank): the tag of the last ticket of that class that left for a slot; and (rank, tenant)
        # -> its last tag. Each class queues fairly on its own: a tenant's waiting batch requests never put its
        # interactive ones behind other tenants' later interactive ones.
        self.virtual: dict[int, float] = {}
        self.last: dict[tuple[int, str], float] = {}


class LocalOccupancy:
    """The counts and the queue in this process's memory. ``clock``: monotonic seconds; ``tenant_caps``: each
    tenant's cap (None: none), for the queue's "can go" (a waiter whose tenant is at its cap lets the next go)."""

    def __init__(
        self,
        fleet_indexes: Callable[[str], object | None] | None = None,
        *,
        clock: Callable[[], float],
        tenant_caps: Mapping[str, int | None] | None = None,
        prefix_ttl_s: float = 600.0,
        on_wake: Callable[[Ticket], None] | None = None,
    ) -> None:
        self._index = fleet_indexes  # worker -> its PrefixIndex (fleet.workers[w].prefix), or None
        self._on_wake = on_wake  # a woken ticket's owner is elsewhere (the supervisor's processes)
        self._clock = clock
        self._tenant_caps = dict(tenant_caps or {})
        self._ttl = prefix_ttl_s
        self.total = 0
        self.models: dict[str, int] = {}
        self.tenants: dict[str, int] = {}
        self.workers: dict[str, int] = {}
        self.worker_batch: dict[str, int] = {}
        self.model_batch: dict[str, int] = {}
        self._flying: dict[str, dict[str, tuple[float | None, float]]] = {}  # worker -> lease -> (work, when taken)
        self._queues: dict[str, _Queue] = {}
        self._waiting = 0

    # -- reading ----------------------------------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return self._waiting

    def can_go(self, tenant: str) -> bool:
        cap = self._tenant_caps.get(tenant)
        return cap is None or self.tenants.get(tenant, 0) < cap

    def _head(self, model: str) -> Ticket | None:
        """The waiter of ``model``'s queue that goes first (:func:`turnout.core.admission.first`)."""
        queue = self._queues.get(model)
        if not queue or not queue.tickets:
            return None
        now = self._clock()
        can_go = {t.tenant: self.can_go(t.tenant) for t in queue.tickets.values()}
        head = first((t.waiter(now) for t in queue.tickets.values()), can_go)
        return None if head is None else queue.tickets[head.id]

    def _ahead(self, model: str, ticket: Ticket | None) -> bool:
        head = self._head(model)
        return head is not None and head is not ticket

    async def view(
        self,
        model: str,
        tenant: str,
        workers: Sequence[str],
        prompt: Prompt | None,
        ticket: Ticket | None,
        slots: Mapping[str, int | None],
        *,
        offers: bool = True,
    ) -> Held:
        return self.held(model, tenant, workers, prompt, ticket, slots)

    def held(
        self,
        model: str,
        tenant: str,
        workers: Sequence[str],
        prompt: Prompt | None,
        ticket: Ticket | None,
        slots: Mapping[str, int | None],
    ) -> Held:
        """:meth:`view`, without awaiting (the supervisor answers its processes with it)."""
        matches: dict[str, Match] = {}
        if prompt is not None and self._index is not None:
            now = self._clock()
            for worker in workers:
                index = self._index(worker)
                if index is not None:
                    matches[worker] = index.match(prompt, now, self._ttl, slots.get(worker))  # type: ignore[attr-defined]
        return Held(
            self.total,
            self.models.get(model, 0),
            self.tenants.get(tenant, 0),
            {w: self.workers.get(w, 0) for w in workers},
            matches,
            self._ahead(model, ticket),
            {w: self.backlog(w) for w in workers},
            self.model_batch.get(model, 0),
        )

    def backlog(self, worker: str) -> Backlog:
        """What ``worker``'s requests in flight are expected to take (the work of those ranked there, as ranked)."""
        flying = self._flying.get(worker)
        if not flying:
            return NO_BACKLOG
        work = [w for w, _ in flying.values() if w is not None]
        return Backlog(sum(work), len(work), self._clock() - min(t for _, t in flying.values()))

    # -- taking and giving back -------------------------------------------------------------------------------
    remote = False

    async def take(self, grant: Grant) -> str | None:
        return self.take_now(grant)

    def take_now(self, grant: Grant) -> str | None:
        """:meth:`take`, without awaiting: atomic in one event loop."""
        batch = grant.priority is Priority.BATCH
        if moved(grant.seen, self.workers.get(grant.worker, 0)):
            return "moved"
        counts = Counts(
            self.total,
            self.models.get(grant.model, 0),
            self.tenants.get(grant.tenant, 0),
            self.workers.get(grant.worker, 0),
            self.worker_batch.get(grant.worker, 0) if batch else 0,
            self.model_batch.get(grant.model, 0) if batch else 0,
        )
        refused = refusal(counts, grant.caps)
        if refused is not None:
            return refused
        if self._ahead(grant.model, grant.ticket):
            return "ahead"
        self.carry(grant)
        if grant.ticket is not None:
            self._left(grant.ticket, served=True)
        if grant.prompt is not None and self._index is not None:
            index = self._index(grant.worker)
            if index is not None:
                index.record(grant.prompt, self._clock())  # type: ignore[attr-defined]
        return None

    def carry(self, grant: Grant) -> None:
        """Count ``grant``'s request, whatever the caps: one already in flight (taken where the counts lived before:
        in Redis, until it went away), so that what is taken here from now on counts it."""
        batch = grant.priority is Priority.BATCH
        self.total += 1
        _bump(self.models, grant.model, 1)
        _bump(self.tenants, grant.tenant, 1)
        _bump(self.workers, grant.worker, 1)
        if batch:
            _bump(self.worker_batch, grant.worker, 1)
            _bump(self.model_batch, grant.model, 1)
        self._flying.setdefault(grant.worker, {})[grant.lease] = (grant.work, self._clock())

    async def settle(self) -> None:
        return None

    def offer(self, grant: Grant, since: float, on_stop: Callable[[], None]) -> None:
        return None  # one process: its dispatcher stops its own lines

    async def stop(self, line: Running) -> bool:
        return False  # (nothing is offered here)

    def give(self, grant: Grant) -> None:
        self.total -= 1
        _bump(self.models, grant.model, -1)
        _bump(self.tenants, grant.tenant, -1)
        _bump(self.workers, grant.worker, -1)
        if grant.priority is Priority.BATCH:
            _bump(self.worker_batch, grant.worker, -1)
            _bump(self.model_batch, grant.model, -1)
        flying = self._flying.get(grant.worker)
        if flying is not None:
            flying.pop(grant.lease, None)
            if not flying:
                del self._flying[grant.worker]
        # the freed slot may be the one any model waited for (global, worker and tenant slots are shared): the first
        # waiter of its own model's queue, then of every other
        self._wake(grant.model)
        for model in list(self._queues):
            if model != grant.model:
                self._wake(model)

    # -- the queue ---------------------------------------------------------------------------------------------
    async def join(self, model: str, tenant: str, weight: int, priority: Priority, max_queue: int) -> Ticket | None:
        return self.join_now(model, tenant, weight, priority, max_queue, next_id("w"))

    def join_now(
        self, model: str, tenant: str, weight: int, priority: Priority, max_queue: int, ticket_id: str
    ) -> Ticket | None:
        if self._waiting >= max_queue:
            return None
        queue = self._queues.get(model)
        if queue is None:
            queue = self._queues[model] = _Queue()
        rank = priority.rank
        tag = fair_tag(queue.last.get((rank, tenant)), queue.virtual.get(rank, 0.0), weight)
        queue.last[rank, tenant] = tag
        ticket = Ticket(ticket_id, model, tenant, priority, tag, self._clock())
        queue.tickets[ticket.id] = ticket
        self._waiting += 1
        return ticket

    async def wait(self, ticket: Ticket, limit_s: float) -> bool:
        return await woken(ticket, limit_s)

    def leave(self, ticket: Ticket) -> None:
        self._left(ticket, served=False)

    def _left(self, ticket: Ticket, *, served: bool) -> None:
        queue = self._queues.get(ticket.model)
        if queue is None or queue.tickets.pop(ticket.id, None) is None:
            return
        self._waiting -= 1
        if served:
            rank = ticket.priority.rank
            queue.virtual[rank] = max(queue.virtual.get(rank, 0.0), ticket.tag)
        if not queue.tickets:
            del self._queues[ticket.model]
        else:
            self._wake(ticket.model)  # the next in line may go now (it was behind this one)

    def _wake(self, model: str) -> None:
        """The first waiter of ``model``'s queue routes again."""
        ticket = self._head(model)
        if ticket is not None:
            ticket.woken.set()
            if self._on_wake is not None:
                self._on_wake(ticket)

    def wake_all(self) -> None:
        for model in list(self._queues):
            self._wake(model)


async def woken(ticket: Ticket, limit_s: float) -> bool:
    """Until ``ticket`` is woken (True, and ready to be woken again) or ``limit_s`` passed (False)."""
    if not ticket.woken.is_set():
        try:
            await asyncio.wait_for(ticket.woken.wait(), limit_s)
        except TimeoutError:
            return False
    ticket.woken.clear()
    return True


def _bump(counts: dict[str, int], name: str, by: int) -> None:
    left = counts.get(name, 0) + by
    if left > 0:
        counts[name] = left
    else:
        counts.pop(name, None)
