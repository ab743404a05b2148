"""The occupancy of `turnout serve --workers N` without Redis: the supervisor keeps it for all its processes.

The supervisor holds one :class:`~turnout.gateway.occupancy.LocalOccupancy` (the requests in flight of every
process, the wait queue, a prefix index per worker) and answers each process over the channel it already keeps for
the rate limits (:mod:`turnout.gateway.shared_limits`): ``occ.view``, ``occ.take`` and ``occ.join`` are asked and
answered, ``occ.give`` and ``occ.leave`` told, and the keeper tells a process ``occ.wake`` when its waiter is the
first of the queue once a slot is given back. So every cap is exact across the processes and work-conserving (a
process whose requests wait takes the slot another process gives back), and the queue is one. A process that ends
gives its slots back at once (its channel closes). Each process's :class:`SupervisedOccupancy` is what its
dispatcher asks.

A process's batch request that may be stopped is offered (``occ.offer``): the keeper lists it in the other processes'
views (``Held.stoppable``), and a process that stops it asks the keeper (``occ.stop``, answered whether it was still
offered: one stop per line), which tells the process holding it ``occ.stop`` with the lease. An offer ends with its
lease (given back, or its process gone).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from turnout.core.admission import Caps, Priority
from turnout.core.preemption import Running
from turnout.core.prefix import Match, PrefixIndex, Prompt
from turnout.core.routing import Backlog
from turnout.gateway.occupancy import Grant, Held, LocalOccupancy, Ticket, next_id, woken
from turnout.gateway.shared_limits import SharedLimiter

__all__ = ["OccupancyKeeper", "SupervisedOccupancy"]

Send = Callable[[int, list[Any]], None]  # (the process's channel, a message to it)


def _prompt(raw: Any) -> Prompt | None:
    if raw is None:
        return None
    keys, size, block, session = raw
    return Prompt(tuple(keys), size, block, session)


def _grant(raw: list[Any]) -> tuple[Grant, str]:
    lease, worker, model, tenant, priority, caps, prompt, ticket, work, seen = raw
    grant = Grant(lease, worker, model, tenant, Priority(priority), Caps(*caps), _prompt(prompt), None, work, seen)
    return grant, ticket


class OccupancyKeeper:
    """The supervisor's side: one occupancy for every process, and which process holds which lease and ticket."""

    def __init__(self, send: Send, *, tenant_caps: Mapping[str, int | None], blocks: int, ttl_s: float) -> None:
        self._send = send
        self._blocks = blocks
        self._indexes: dict[str, PrefixIndex] = {}
        self.occupancy = LocalOccupancy(
            self._index, clock=time.monotonic, tenant_caps=tenant_caps, prefix_ttl_s=ttl_s, on_wake=self._woken
        )
        self._leases: dict[str, tuple[int, Grant]] = {}  # lease -> (its process's channel, the grant)
        self._tickets: dict[str, tuple[int, Ticket]] = {}  # ticket -> (its process's channel, the ticket)
        self._offers: dict[str, tuple[int, Running]] = {}  # lease -> (its process's channel, the line it offers)

    def _index(self, worker: str) -> PrefixIndex:
        index = self._indexes.get(worker)
        if index is None:
            index = self._indexes[worker] = PrefixIndex(self._blocks, min(self._blocks, 4096))
        return index

    def _woken(self, ticket: Ticket) -> None:
        owner = self._tickets.get(ticket.id)
        if owner is not None:
            self._send(owner[0], [0, "occ.wake", ticket.id])

    def apply(self, fd: int, message: list[Any]) -> list[Any] | None:
        """One process's message; the answer to send back (None: none)."""
        n, op = message[0], message[1]
        occupancy = self.occupancy
        if op == "occ.view":
            model, tenant, workers, prompt, ticket_id, slots, offers = message[2:]
            ticket = self._tickets.get(ticket_id, (0, None))[1] if ticket_id else None
            held = occupancy.held(model, tenant, workers, _prompt(prompt), ticket, slots)
            matches = {w: list(m) for w, m in held.matches.items()}
            backlogs = {w: list(b) for w, b in held.backlogs.items()}
            named = set(workers)
            stoppable = [
                list(line)
                for owner, line in self._offers.values()
                if offers and owner != fd and line.model == model and line.worker in named
            ]
            return [
                n,
                held.total,
                held.model,
                held.tenant,
                held.workers,
                matches,
                held.ahead,
                backlogs,
                held.model_batch,
                stoppable,
            ]
        if op == "occ.take":
            grant, ticket_id = _grant(message[2])
            ticket = self._tickets.get(ticket_id, (0, None))[1] if ticket_id else None
            refused = occupancy.take_now(grant._replace(ticket=ticket))
            if refused is None:
                self._leases[grant.lease] = (fd, grant)
                if ticket is not None:
                    self._tickets.pop(ticket.id, None)
            return [n, refused]
        if op == "occ.give":
            held_lease = self._leases.pop(message[2], None)
            self._offers.pop(message[2], None)
            if held_lease is not None:
                occupancy.give(held_lease[1])
            return None
        if op == "occ.offer":
            lease, since = message[2], message[3]
            holder = self._leases.get(lease)
            if holder is not None and holder[0] == fd:
                grant = holder[1]
                self._offers[lease] = (fd, Running(lease, grant.worker, grant.model, since, grant.work))
            return None
        if op == "occ.stop":
            offered = self._offers.pop(message[2], None)
            if offered is not None:
                self._send(offered[0], [0, "occ.stop", message[2]])
            return [n, offered is not None]
        if op == "occ.join":
            model, tenant, weight, priority, max_queue, ticket_id = message[2:]
            ticket = occupancy.join_now(model, tenant, weight, Priority(priority), max_queue, ticket_id)
            if ticket is None:
                return [n, None]
            self._tickets[ticket.id] = (fd, ticket)
            return [n, ticket.tag]
        if op == "occ.leave":
            owned = self._tickets.pop(message[2], None)
            if owned is not None:
                occupancy.leave(owned[1])
            return None
        if op == "occ.wakeall":
            occupancy.wake_all()
            return None
        raise ValueError(f"unknown operation {op!r}")

    def gone(self, fd: int) -> None:
        """A process ended: its slots are given back, its waiters leave."""
        for lease, (owner, grant) in list(self._leases.items()):
            if owner == fd:
                del self._leases[lease]
                self._offers.pop(lease, None)
                self.occupancy.give(grant)
        for ticket_id, (owner, ticket) in list(self._tickets.items()):
            if owner == fd:
                del self._tickets[ticket_id]
                self.occupancy.leave(ticket)


class SupervisedOccupancy:
    """A process's side: its dispatcher's occupancy, asked of the supervisor over ``channel``."""

    remote = True

    def __init__(self, channel: SharedLimiter) -> None:
        self._channel = channel
        self._tickets: dict[str, Ticket] = {}
        self._offered: dict[str, Callable[[], None]] = {}  # lease -> what stops it (another process asked)

    @property
    def waiting(self) -> int:
        return len(self._tickets)

    def told(self, message: list[Any]) -> None:
        """What the supervisor says unasked: ``occ.wake`` (this process's waiter is first now) or ``occ.stop``
        (another process stops this process's batch request)."""
        if message[1] == "occ.wake":
            self.woken(message[2])
        elif message[1] == "occ.stop":
            on_stop = self._offered.pop(message[2], None)
            if on_stop is not None:
                on_stop()

    def woken(self, ticket_id: str) -> None:
        """The supervisor says this process's waiter is first now."""
        ticket = self._tickets.get(ticket_id)
        if ticket is not None:
            ticket.woken.set()

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
        raw = None if prompt is None else [list(prompt.keys), prompt.size, prompt.block, prompt.session]
        ticket_id = "" if ticket is None else ticket.id
        answer = await self._channel.ask("occ.view", model, tenant, list(workers), raw, ticket_id, dict(slots), offers)
        total, in_model, in_tenant, counts, matches, ahead, backlogs, in_batch, stoppable = answer[1:]
        found = {w: Match(*m) for w, m in matches.items()}
        queued = {w: Backlog(*b) for w, b in backlogs.items()}
        lines = tuple(Running(*line) for line in stoppable)  # (one machine: one monotonic clock)
        return Held(total, in_model, in_tenant, counts, found, ahead, queued, in_batch, lines)

    async def take(self, grant: Grant) -> str | None:
        prompt = grant.prompt
        raw_prompt = None if prompt is None else [list(prompt.keys), prompt.size, prompt.block, prompt.session]
        ticket_id = "" if grant.ticket is None else grant.ticket.id
        raw = [grant.lease, grant.worker, grant.model, grant.tenant, grant.priority.value, list(grant.caps)]
        answer = await self._channel.ask("occ.take", [*raw, raw_prompt, ticket_id, grant.work, grant.seen])
        refused: str | None = answer[1]
        if refused is None and grant.ticket is not None:
            self._tickets.pop(grant.ticket.id, None)
        return refused

    def give(self, grant: Grant) -> None:
        self._offered.pop(grant.lease, None)
        self._channel.tell("occ.give", grant.lease)

    def offer(self, grant: Grant, since: float, on_stop: Callable[[], None]) -> None:
        self._offered[grant.lease] = on_stop
        self._channel.tell("occ.offer", grant.lease, since)

    async def stop(self, line: Running) -> bool:
        answer = await self._channel.ask("occ.stop", line.lease)
        return bool(answer[1])

    async def settle(self) -> None:
        return None  # a frame to the supervisor, sent in order before this process's next one

    async def join(self, model: str, tenant: str, weight: int, priority: Priority, max_queue: int) -> Ticket | None:
        ticket_id = next_id(f"p{os.getpid()}-")
        answer = await self._channel.ask("occ.join", model, tenant, weight, priority.value, max_queue, ticket_id)
        if answer[1] is None:
            return None
        ticket = Ticket(ticket_id, model, tenant, priority, float(answer[1]), time.monotonic())
        self._tickets[ticket_id] = ticket
        return ticket

    async def wait(self, ticket: Ticket, limit_s: float) -> bool:
        return await woken(ticket, limit_s)

    def leave(self, ticket: Ticket) -> None:
        if self._tickets.pop(ticket.id, None) is not None:
            self._channel.tell("occ.leave", ticket.id)

    def wake_all(self) -> None:
        self._channel.tell("occ.wakeall")
