"""Admission: route a request, hold its concurrency slots, queue it while everything is busy.

Wraps the pure router with what is held (:mod:`turnout.gateway.occupancy`: the requests in flight globally, per
model, per tenant and per worker, and one bounded wait queue per model), wherever it is kept: this process's
memory, the supervisor of `turnout serve --workers N`, or Redis for any number of replicas. Each attempt reads
what is held, routes, and takes the chosen worker's slot atomically against every cap and the queue's order; one
that cannot go joins the queue (ordered by priority class, then weighted fair queueing between tenants:
:mod:`turnout.core.admission`) and routes again when a slot is given back, until ``routing.queue_timeout_s``. A
tenant at its ``max_concurrent`` waits without blocking other tenants.

Where a model has more than one candidate worker, the request's prompt (its parts as the worker will see them,
and the client's session, through the dialect: :class:`Ask`) is matched against each worker's prefix index and
the router ranks them by expected time (:mod:`turnout.core.routing`); the prompt is recorded in the index of the
worker it goes to as its slot is taken, so that the next request of the same conversation follows it even while
this one runs, whichever process or replica it reaches. With a single candidate none of this is computed.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NoReturn

from turnout.config import Routing, Tenant
from turnout.core import admission
from turnout.core.admission import Caps, Priority, served_as
from turnout.core.headroom import QUIET_S, RecentPeak, batch_caps
from turnout.core.parallelism import Span
from turnout.core.patterns import best_value
from turnout.core.preemption import PREEMPTORS, Running, victim
from turnout.core.prefix import BYTES_PER_TOKEN, PrefixIndex, Prompt, prompt_of
from turnout.core.routing import (
    DEFAULT_OUTPUT_TOKENS,
    NO_DEMAND,
    Backlog,
    Capacity,
    Demand,
    LoadGuard,
    NoRoute,
    NoRouteReason,
    Reason,
    Route,
    WorkerView,
    installed_name,
    route,
)
from turnout.core.sharing import full_speed
from turnout.dialects import api
from turnout.dialects.base import Call
from turnout.errors import Forbidden, NotFound, TurnoutError, Unavailable
from turnout.fleet.state import Fleet, WorkerState
from turnout.gateway.occupancy import Grant, Held, LocalOccupancy, Occupancy, Ticket, next_id
from turnout.gateway.timing import Holding, Phases
from turnout.metrics import Metrics

__all__ = ["Ask", "Dispatcher", "Lease", "no_route_error"]


class Ask:
    """What routing reads of one call beyond its model: its prompt (with the client's session) and the length of
    the answer it asks for. Worked out once per request, on first use, and only where there is a choice of
    workers."""

    __slots__ = ("_done", "_prompt", "call", "headers", "session_header")

    def __init__(self, call: Call, headers: Mapping[str, str], session_header: str | None = None) -> None:
        self.call = call
        self.headers = headers
        self.session_header = session_header
        self._prompt: Prompt | None = None
        self._done = False

    def prompt(self, block_bytes: int) -> Prompt | None:
        """The prompt as the prefix index sees it; None when the call has neither a prompt nor a session."""
        if not self._done:
            self._done = True
            call = self.call
            dialect = api(call.dialect)
            session = self.headers.get(self.session_header) if self.session_header else None
            session = session or dialect.session_key(call, self.headers)
            parts = dialect.prompt_parts(call)
            if parts or session:
                self._prompt = prompt_of(parts, block_bytes, call.model, session)
        return self._prompt

    def output_tokens(self, learned: float | None) -> float:
        """The answer's expected length: the model's learned mean, within the call's own limit."""
        expected = learned or DEFAULT_OUTPUT_TOKENS
        payload = self.call.payload
        limit = payload.get("max_tokens", payload.get("max_completion_tokens"))
        options = payload.get("options")
        if limit is None and isinstance(options, dict):
            limit = options.get("num_predict")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            return min(expected, float(limit))
        return expected


@dataclass(slots=True)
class Lease:
    """Slots held by one attempt on one worker; release exactly once."""

    worker: WorkerState
    model: str  # name sent upstream
    requested: str
    tenant: str
    _dispatcher: Dispatcher
    _released: bool = False
    why: str = Reason.ONLY.value  # why this worker (the access log's route=)
    choice: bool = False  # there were other candidates (only then are speeds learned: they rank candidates)
    prompt: Prompt | None = None  # as recorded in its prefix index (None: no choice, or no prompt)
    share: float = 0.0  # of the prompt it was expected to hold
    queued: bool = False  # all its slots were busy when this was sent: the engine queues it
    # monotonic (loop) times: sent, and the engine seen working on it (first and last bytes of its answer's stream,
    # or the span its own timings give); they teach the worker's parallelism (:meth:`WorkerState.ran`)
    sent_at: float = 0.0
    first_at: float | None = None
    last_at: float = 0.0
    grant: Grant | None = None  # the slot it holds in the occupancy's counts
    stop: Callable[[], None] | None = None  # stops the batch request holding it (:mod:`turnout.core.preemption`)
    seen: int | None = None  # its worker runs batch requests it may stop, and ran this many requests before it
    flown: float = 0.0  # its worker's requests in flight integrated over time when it was sent (WorkerState.flown)
    elsewhere: int = 0  # other processes' and replicas' requests in flight on its worker when it was sent

    def answering(self, now: float) -> None:
        """Events of its answer (not keep-alive comments) arrived from the worker: the engine is working on it."""
        if self.first_at is None:
            self.first_at = now
        self.last_at = now

    def worked(self, seconds: float | None, now: float) -> None:
        """An answer in one piece ended ``now``, after the engine worked on it ``seconds`` (its own timings)."""
        if seconds is not None and seconds > 0 and self.first_at is None:
            self.first_at = max(now - seconds, self.sent_at)
            self.last_at = now

    def beside(self, now: float) -> float | None:
        """How many other requests were in flight on its worker on average from its sending to ``now`` (None:
        no time has passed): this process's, counted as they came and went, and the other processes' and replicas'
        as their keeper counted them when it was sent (taken to stay)."""
        if now <= self.sent_at:
            return None
        return max((self.worker.flown(now) - self.flown) / (now - self.sent_at) - 1.0, 0.0) + self.elsewhere

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._dispatcher._release(self)


_NOTHING_HELD = Held(0, 0, 0, {}, {}, False)  # a view not asked for: the take checks every cap
HOLD_RECHECK_S = 0.5  # a held request looks again this often (a wake missed costs at most this)
# A waiter routes again at least this often, woken or not: what holds it may change with no slot given back (a
# worker back up, the batch headroom's window moving on), and a Batch API line waits as long as its window lasts.
WAIT_RECHECK_S = 5.0
AGED_LATE_S = 0.01  # a batch waiter wakes this long after it ages (served as standard from then: admission)
# Times a request is routed again when the worker it chose took other requests before its own take (replicas routing
# at the same moment); the last decision is then taken as it is, so a busy fleet never loops.
REROUTES = 2
MAX_PEAKS = 4096  # models whose other traffic's peak is kept (a bound: a model name is the client's)
RECENTLY_S = 60.0  # a worker healthy this recently and down now is restarting: requests for it are held


class Dispatcher:
    def __init__(
        self,
        fleet: Fleet,
        routing: Routing,
        metrics: Metrics,
        *,
        retry_after_s: int,
        tenants: Mapping[str, Tenant] | None = None,
        occupancy: Occupancy | None = None,
    ) -> None:
        self.fleet = fleet
        self.routing = routing
        self.metrics = metrics
        self.retry_after_s = retry_after_s
        self.tenants = dict(tenants or {})
        caps = {name: t.max_concurrent for name, t in self.tenants.items()}
        self.occupancy: Occupancy = occupancy or LocalOccupancy(
            self._index, clock=time.monotonic, tenant_caps=caps, prefix_ttl_s=routing.prefix_ttl_s
        )
        self._limits = routing.model_limits()
        self._rotation = 0
        self._peaks: dict[str, RecentPeak] = {}  # per model: its other traffic's peak in flight (batch's headroom)
        self._routed = metrics.routing.labels("routed")
        self._reasons = metrics.route_reasons
        for reason in Reason:
            self._reasons[reason.value] = 0
        self._guard = LoadGuard(routing.load_guard_absolute, routing.load_guard_relative)
        self._stoppable: dict[str, tuple[Running, Lease]] = {}  # this process's batch requests that may be stopped
        # per model, the other processes' batch requests that may be stopped, as the last view saw them
        self._elsewhere: dict[str, tuple[Running, ...]] = {}

    def _index(self, worker: str) -> PrefixIndex | None:
        state = self.fleet.workers.get(worker)
        return None if state is None else state.prefix

    def _tenant_cap(self, tenant: str) -> int | None:
        cfg = self.tenants.get(tenant)
        return None if cfg is None else cfg.max_concurrent

    def _weight(self, tenant: str) -> int:
        cfg = self.tenants.get(tenant)
        return 1 if cfg is None else cfg.weight

    @property
    def waiting(self) -> int:
        return self.occupancy.waiting

    async def acquire(
        self,
        model: str,
        exclude: frozenset[str] = frozenset(),
        tenant: str = "",
        ask: Ask | None = None,
        priority: Priority = Priority.STANDARD,
        *,
        ticket: Ticket | None = None,
        hold_s: float = 0.0,
        phases: Phases | None = None,
        stop: Callable[[], None] | None = None,
        queue_s: float | None = None,
    ) -> Lease:
        """A slot for ``model``. ``ticket``: its place in the queue, kept from a hold (:meth:`hold`); ``hold_s``: how
        long it may wait for workers that are down for a moment (healthy within :data:`RECENTLY_S`: a restart),
        instead of the 503 at once; that wait is the request's ``hold`` phase (``phases``, the request's timing:
        :mod:`turnout.gateway.timing`) and counts in ``turnout_held_requests``. ``stop``: a batch request that may
        be stopped while it holds its slot, for a request of a higher class that waits for one
        (:func:`turnout.core.preemption.victim`); called at most once, before the slot is given back. ``queue_s``:
        how long it may wait in the queue (None: ``routing.queue_timeout_s``; a Batch API line's: its window's)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        queue_s = self.routing.queue_timeout_s if queue_s is None else queue_s
        deadline = started + queue_s
        held_until = started + hold_s
        holding: Holding | None = None  # while it is held (its workers expected back)
        stopped = False  # it stopped a batch request (at most one)
        if ticket is not None:
            self.metrics.queued.inc()  # (the hold gave its count back with the ticket)
        try:
            while True:
                waited = 0.0 if ticket is None else loop.time() - ticket.since  # (both monotonic seconds)
                aged = served_as(priority, waited) is not priority  # a batch request served as standard
                try:
                    lease, message, why = await self._try(model, exclude, tenant, ask, priority, ticket, aged)
                except Unavailable as exc:
                    if exc.code != NoRouteReason.NO_HEALTHY.value or not self._coming_back(model):
                        raise
                    if loop.time() >= held_until:
                        raise
                    lease, message, why, deadline = None, exc.message, "", held_until  # a worker is coming back
                    if holding is None:
                        holding = Holding(phases, self.metrics).begin()
                else:
                    if lease is None and loop.time() < held_until and self._all_coming_back(model):
                        # behind requests held for the same workers (they are "ahead"): held alike
                        deadline = held_until
                        if holding is None:
                            holding = Holding(phases, self.metrics).begin()
                    elif holding is not None:  # a worker is back: any further wait is the queue's
                        holding.end()
                        holding = None
                if lease is not None:
                    if ticket is not None:
                        self.metrics.queue_wait.observe(loop.time() - started)
                    if stop is not None and priority is Priority.BATCH and lease.grant is not None:
                        self._stoppable_now(lease, stop)
                    if lease.seen is not None and not stopped:
                        await self._stop_where(lease, lease.seen)
                    return lease
                if not stopped:
                    stopped = await self._preempt(model, exclude, priority, why)
                remaining = deadline - loop.time()
                if ticket is None and remaining > 0:
                    ticket = await self.occupancy.join(
                        model, tenant, self._weight(tenant), priority, self.routing.max_queue
                    )
                    if ticket is None:
                        self._saturated(message, "the wait queue is full")
                    self.metrics.queued.inc()
                    # at once again, in its place: it may be first now (an interactive request behind waiting batch
                    # lines that cannot go is; it waited for a slot to be given back, with engines idle)
                    continue
                if remaining <= 0:
                    if ticket is not None:
                        self.metrics.queue_wait.observe(loop.time() - started)
                    self._saturated(message, f"waited {queue_s:g}s")
                assert ticket is not None
                if priority is Priority.BATCH and not aged:  # it routes again as it ages (may take a slot then)
                    remaining = min(remaining, admission.BATCH_AGEING_S - (loop.time() - ticket.since) + AGED_LATE_S)
                await self.occupancy.wait(ticket, min(remaining, WAIT_RECHECK_S))
        finally:
            if holding is not None:
                holding.end()
            if ticket is not None:
                self.occupancy.leave(ticket)  # (nothing, once it took a slot)
                self.metrics.queued.dec()

    async def hold(
        self,
        model: str,
        tenant: str,
        priority: Priority,
        ready: Callable[[], bool],
        limit_s: float,
        phases: Phases | None = None,
    ) -> Ticket | None:
        """Wait for ``model`` to become ready (``ready()``: a sleeping or activating claim's engine is bound) for at
        most ``limit_s``, in its queue: counted against ``routing.max_queue``, keeping a fair place (the held
        requests go in the queue's order once it is ready). The ticket, still in the queue (for :meth:`acquire`), or
        None when the time ran out. Raises 503 ``saturated`` when the queue is full. The wait is the request's
        ``hold`` phase (``phases``: :mod:`turnout.gateway.timing`) and counts in ``turnout_held_requests``."""
        ticket = await self.occupancy.join(model, tenant, self._weight(tenant), priority, self.routing.max_queue)
        if ticket is None:
            self._saturated(f'model "{model}" is not ready', "the wait queue is full")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        try:
            with Holding(phases, self.metrics):
                while not ready():
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        self.occupancy.leave(ticket)
                        return None
                    await self.occupancy.wait(ticket, min(remaining, HOLD_RECHECK_S))
        except BaseException:
            self.occupancy.leave(ticket)
            raise
        return ticket

    def _all_coming_back(self, model: str) -> bool:
        """No candidate for ``model`` is healthy, and one is coming back (:meth:`_coming_back`)."""
        return not any(s.healthy for s in self.fleet.candidates(model)) and self._coming_back(model)

    def worth_waiting_for(self, model: str) -> bool:
        """Whether a worker that may serve ``model`` and cannot now is worth waiting for: its last listing held the
        model, or it is down, was healthy within :data:`RECENTLY_S` and its models are not known. False where no
        worker is known to hold it and none is restarting (the model may not exist:
        :data:`turnout.core.batches.UNLISTED_WAIT_S`)."""
        now = time.monotonic()
        return any(
            installed_name(model, s.inventory) is not None or (s.inventory is None and _restarting(s, now))
            for s in self.fleet.candidates(model)
        )

    def _coming_back(self, model: str) -> bool:
        """A candidate for ``model`` is down but was healthy within :data:`RECENTLY_S` (a restart): worth a wait."""
        now = time.monotonic()
        return any(_restarting(s, now) for s in self.fleet.candidates(model))

    async def _try(
        self,
        model: str,
        exclude: frozenset[str],
        tenant: str,
        ask: Ask | None,
        priority: Priority,
        ticket: Ticket | None,
        aged: bool = False,
    ) -> tuple[Lease | None, str, str]:
        """One attempt: (a lease, "", ""), or (None, why it must wait, that reason's count: ``tenant``, ``ahead``,
        ``worker_batch``, ``model_batch``, ``total``, ``model``, ``worker``, or the router's ``saturated``). No-route
        answers other than saturation raise.

        A worker chosen on counts that no longer hold when its slot is taken (it took requests in between: another
        replica routed at the same moment, :func:`turnout.core.admission.moved`) is chosen again on the new counts,
        at most :data:`REROUTES` times; then the last choice is taken as it is."""
        for left in range(REROUTES, -1, -1):
            outcome = await self._attempt(model, exclude, tenant, ask, priority, ticket, check=left > 0, aged=aged)
            if outcome is not None:
                return outcome
            self.metrics.routing.labels("moved").inc()
        raise AssertionError("the last attempt checks nothing, so it is never moved")

    async def _attempt(
        self,
        model: str,
        exclude: frozenset[str],
        tenant: str,
        ask: Ask | None,
        priority: Priority,
        ticket: Ticket | None,
        *,
        check: bool,
        aged: bool = False,
    ) -> tuple[Lease | None, str, str] | None:
        """:meth:`_try`'s one view, decision and take; None: the worker moved (``check``: the take checks that its
        requests in flight are still those the decision saw)."""
        candidates = self.fleet.candidates(model)
        choice = len(candidates) > 1
        prompt, demand = self._demand(model, ask) if choice else (None, NO_DEMAND)
        cap = self._tenant_cap(tenant)
        model_max = best_value(model, self._limits)
        held = await self._view(model, tenant, candidates, prompt, ticket, priority, choice)
        states = {state.name: state for state in candidates}  # (the fleet may have let one go while this waited)
        if cap is not None and held.tenant >= cap:
            return None, self._refused("tenant", model, tenant), "tenant"
        if held.ahead:
            return None, self._refused("ahead", model, tenant), "ahead"
        matches = held.matches if prompt is not None else None
        views = self.fleet.views(model, prompt, candidates, held.workers, matches, held.backlogs)
        stoppable = self._stoppable_here(model, priority, held.stoppable)
        if stoppable and choice:
            if _all_busy(model, views, exclude):  # ranked as if one were stopped: one is, where it goes
                counts, backlogs = _without(self._least_lost(model, priority, stoppable), held.workers, held.backlogs)
                views = self.fleet.views(model, prompt, candidates, counts, matches, backlogs)
            else:  # a slot is free: nothing is stopped
                stoppable = {}
        capacity = Capacity(held.total, self.routing.max_concurrent, held.model, model_max)
        full: set[str] = set()  # workers whose batch share is taken: a batch request tries the next one
        headroom = self._headroom(model, views, exclude, held, priority, states)
        if aged:  # waited BATCH_AGEING_S: served as a standard request, which no batch headroom holds back
            headroom = None
        if headroom is not None:  # a batch request goes only where a slot is free (never into an engine's queue),
            views = [_slots_capped(v, states[v.name]) for v in views]  # unless it orders its queue
        while True:
            decision = route(
                model,
                views,
                capacity,
                exclude=exclude | full,
                rotation=self._rotation,
                demand=demand,
                guard=self._guard,
                served_elsewhere=not candidates and bool(self.fleet.workers),
            )
            if isinstance(decision, NoRoute):
                if full:  # every other candidate is busy or out: it waits for a batch slot
                    return None, self._refused("worker_batch", model, tenant, next(iter(full))), "worker_batch"
                if decision.reason is not NoRouteReason.SATURATED:
                    self.metrics.routing.labels(decision.reason.value).inc()
                    raise no_route_error(decision, self.retry_after_s)
                return None, decision.message, "saturated"
            best = decision.best
            worker = states[best.worker]
            caps = Caps(self.routing.max_concurrent, model_max, cap, worker.config.max_concurrent)
            if headroom is not None:
                fleet, others = headroom
                runs = self._slots(worker, model)
                speed = self._full_speed(worker, model)
                mine, together = batch_caps(runs, fleet, self.routing.batch_share, others, speed)
                if not worker.config.priority_scheduling:
                    caps = caps._replace(worker=_least(caps.worker, runs))
                caps = caps._replace(worker_batch=mine, model_batch=together)
            recorded = prompt if choice else None
            work = best.work if choice else None
            seen = held.workers.get(best.worker) if choice and check else None
            grant = Grant(next_id("l"), best.worker, model, tenant, priority, caps, recorded, ticket, work, seen)
            refused = await self.occupancy.take(grant)
            if refused == "moved":
                return None
            if refused == "worker_batch" and choice:
                full.add(best.worker)
                continue
            if refused is not None:
                return None, self._refused(refused, model, tenant, best.worker), refused
            break
        self._routed.inc()
        self._reasons[decision.reason] += 1
        self._rotation += 1
        lease = self._take(worker, best.model, grant)
        # other processes' and replicas' requests there (the keeper's count less this process's): their company
        lease.elsewhere = max(held.workers.get(best.worker, 0) - (worker.in_flight - 1), 0)
        if best.worker in stoppable:  # (acquire stops one there when the engine is full: _stop_where)
            lease.seen = held.workers.get(best.worker, 0)
        if choice:  # (even when only one of them was free just now)
            self._placed(lease, decision, prompt, time.monotonic())
        return lease, "", ""

    async def _view(
        self,
        model: str,
        tenant: str,
        candidates: list[WorkerState],
        prompt: Prompt | None,
        ticket: Ticket | None,
        priority: Priority,
        choice: bool,
    ) -> Held:
        """What is held on the candidates (every process's), or nothing: one candidate, counts kept elsewhere and
        nothing this request may stop, where the take checks every cap (one round trip, not two). A single
        candidate is viewed too when the request may stop another process's batch request (the view lists them)."""
        occupancy = self.occupancy
        may_stop_elsewhere = priority in PREEMPTORS and self.routing.preempt_batch
        if occupancy.remote and not choice and not may_stop_elsewhere:
            return _NOTHING_HELD
        names = [state.name for state in candidates]
        now = time.monotonic()
        slots = {s.name: s.parallelism(model, now).slots for s in candidates} if prompt is not None else {}
        held = await occupancy.view(model, tenant, names, prompt, ticket, slots, offers=may_stop_elsewhere)
        if may_stop_elsewhere:  # (a view that read none says nothing of them)
            self._elsewhere[model] = held.stoppable
        return held

    def _headroom(
        self,
        model: str,
        views: list[WorkerView],
        exclude: frozenset[str],
        held: Held,
        priority: Priority,
        states: dict[str, WorkerState],
    ) -> tuple[list[int | None] | None, int] | None:
        """Note how many of ``model``'s requests in flight are not batch requests (this one included; every
        replica's); for a batch request, what :func:`turnout.core.headroom.batch_caps` needs: what each worker that
        may serve the model now runs at once (healthy, allowed, holding it, busy or not; None: a single candidate)
        and the other traffic's recent peak."""
        now = time.monotonic()
        peak = self._peaks.get(model)
        if held is not _NOTHING_HELD and (peak is not None or len(self._peaks) < MAX_PEAKS):
            if peak is None:
                peak = self._peaks[model] = RecentPeak(QUIET_S)
            peak.see(held.model - held.model_batch + (priority is not Priority.BATCH), now)
        if priority is not Priority.BATCH:
            return None
        fleet = None
        if len(states) > 1:
            fleet = [self._full_speed(states[w], model) for w in _eligible(model, views, exclude) or []]
        return fleet, 0 if peak is None else peak.peak(now)

    def _slots(self, worker: WorkerState, model: str) -> int | None:
        """What ``worker``'s engine runs at once (its ``max_concurrent`` for a batching engine of unknown capacity)."""
        return worker.parallelism(model, time.monotonic()).slots or worker.config.max_concurrent

    def _full_speed(self, worker: WorkerState, model: str) -> int | None:
        """What ``worker``'s engine gets through at full speed (:func:`turnout.core.sharing.full_speed`: its slots,
        fewer where they are learned to share its speed): what batch headroom is counted in."""
        now = time.monotonic()
        learned = worker.learned.get(model)
        sharing = None if learned is None else learned.fresh_sharing(now, self.routing.speed_ttl_s)
        return full_speed(self._slots(worker, model), sharing)

    def _refused(self, count: str, model: str, tenant: str, worker: str = "") -> str:
        """Why a request waits, by the count at its cap (:func:`turnout.core.admission.refusal`), in the words of the
        router's own saturation messages."""
        if count == "tenant":
            return f'tenant "{tenant}" is at its limit of {self._tenant_cap(tenant)} concurrent requests'
        if count == "total":
            return f"the gateway is at its limit of {self.routing.max_concurrent} concurrent requests"
        if count == "model":
            return f'model "{model}" is at its limit of {best_value(model, self._limits)} concurrent requests'
        if count == "ahead":
            return f'requests for model "{model}" are waiting ahead of this one'
        if count == "worker_batch":
            return f'batch requests hold their share of every worker for model "{model}" ({worker} the last tried)'
        if count == "model_batch":
            return f'batch requests hold their share of the slots of model "{model}"'
        return f'every worker for model "{model}" is busy ({worker})'

    def _saturated(self, message: str, why: str) -> NoReturn:
        self.metrics.routing.labels("saturated").inc()
        raise Unavailable(f"{message}; {why}", code="saturated", retry_after=self._saturated_retry_after())

    def locate(self, model: str) -> Route | NoRoute:
        """Route without taking or checking slots: for metadata calls such as ``/api/show``."""
        views = [v._replace(max_concurrent=None) for v in self.fleet.views(model)]
        return route(model, views)

    def wake_all(self) -> None:
        """Fleet changed (a worker came up, rules changed): let every queue's next waiter retry."""
        self.occupancy.wake_all()

    # -- internals -------------------------------------------------------------------------------
    def _demand(self, model: str, ask: Ask | None) -> tuple[Prompt | None, Demand]:
        """The request's prompt (when prefix affinity is on) and what it asks of a worker."""
        if ask is None:
            return None, NO_DEMAND
        prompt = ask.prompt(self.routing.prefix_block_bytes) if self.routing.prefix_affinity else None
        size = prompt.size if prompt is not None else len(ask.call.body)
        return prompt, Demand(size, ask.output_tokens(self.fleet.completion.get(model)))

    def _placed(self, lease: Lease, decision: Route, prompt: Prompt | None, now: float) -> None:
        """A request for a model with several candidate workers goes to ``lease.worker``: why, and what it holds
        (its prompt was recorded in that worker's prefix index by the occupancy's keeper as the slot was taken)."""
        worker = lease.worker
        lease.why = decision.why
        lease.choice = True
        slots = worker.parallelism(lease.requested, now).slots
        lease.queued = slots is not None and worker.in_flight > slots
        if prompt is None:
            return
        lease.prompt = prompt
        cached = decision.best.cached
        lease.share = min(cached / prompt.size, 1.0) if prompt.size else 0.0
        worker.routed(prompt.size / BYTES_PER_TOKEN, cached / BYTES_PER_TOKEN)
        self.metrics.prefix_tokens(worker.name, prompt.size / BYTES_PER_TOKEN, cached / BYTES_PER_TOKEN)

    def _take(self, worker: WorkerState, upstream_model: str, grant: Grant) -> Lease:
        now = time.monotonic()
        flown = worker.flown(now)
        worker.in_flight += 1
        return Lease(worker, upstream_model, grant.model, grant.tenant, self, grant=grant, sent_at=now, flown=flown)

    def _stoppable_now(self, lease: Lease, stop: Callable[[], None]) -> None:
        """``lease``'s batch request may be stopped from now until its slot is given back: by a request this process
        routes, or (offered through the occupancy) one another process or replica routes."""
        grant = lease.grant
        assert grant is not None
        lease.stop = stop
        running = Running(grant.lease, grant.worker, grant.model, lease.sent_at, grant.work)
        self._stoppable[grant.lease] = (running, lease)
        if self.routing.preempt_batch:

            def stopped_elsewhere() -> None:  # (a request another process routes stops it)
                self._stop(grant.lease)

            self.occupancy.offer(grant, lease.sent_at, stopped_elsewhere)

    def _stop(self, lease_id: str) -> bool:
        """Stop this process's batch request ``lease_id`` (False: it is not running here, or not stoppable now)."""
        entry = self._stoppable.pop(lease_id, None)
        if entry is None:
            return False
        lease = entry[1]
        stop, lease.stop = lease.stop, None
        if stop is None:
            return False
        self.metrics.preempted.inc()
        stop()
        return True

    def _running(self, model: str, elsewhere: Iterable[Running] = ()) -> list[Running]:
        """The batch requests for ``model`` that may be stopped: this process's (whether each one's answer has begun:
        its engine past its prefill) and ``elsewhere``'s (the other processes', as a view saw them)."""
        mine = [r._replace(answering=lease.first_at is not None) for r, lease in self._stoppable.values()]
        return [r for r in (*mine, *elsewhere) if r.model == model]

    def _stoppable_here(
        self, model: str, priority: Priority, elsewhere: Iterable[Running] = ()
    ) -> dict[str, list[Running]]:
        """Per worker not capped by ``max_concurrent``, the batch requests for ``model`` a request of ``priority``
        would stop where it goes (this process's and ``elsewhere``'s; none when it stops none:
        :data:`turnout.core.preemption.PREEMPTORS`, ``routing.preempt_batch``)."""
        if priority not in PREEMPTORS or not self.routing.preempt_batch:
            return {}
        here: dict[str, list[Running]] = {}
        for running in self._running(model, elsewhere):
            # (on a worker capped by max_concurrent a request that finds it full waits in the gateway's queue, and
            # stops one from there: acquire)
            state = self.fleet.workers.get(running.worker)
            if state is not None and state.config.max_concurrent is None:
                here.setdefault(running.worker, []).append(running)
        return here

    def _least_lost(
        self, model: str, priority: Priority, stoppable: Mapping[str, list[Running]]
    ) -> dict[str, list[Running]]:
        """Of the batch requests a request of ``priority`` may stop on these workers, the one whose stop throws the
        least work away (:func:`turnout.core.preemption.victim`: the one that started last). The request is ranked as
        if only that one were stopped, so it goes there, unless another worker is still expected to answer it first
        (the prompt it holds), where it stops the line that started last (:meth:`_stop_where`). Ranked as if every
        line were stopped, it went wherever routing would send it on an idle fleet, and stopped the line there, an
        old one as often as a new one."""
        chosen = victim((r for lines in stoppable.values() for r in lines), priority, "worker", model, set(stoppable))
        return {} if chosen is None else {chosen.worker: [chosen]}

    async def _stop_where(self, lease: Lease, seen: int) -> None:
        """``lease``'s request went to a worker that runs a batch request it may stop: stop one when the worker's
        engine runs no more at once than it holds now (``seen``: its requests in flight before this one, every
        replica's), so that this request starts at once instead of waiting in the engine's queue."""
        worker, grant = lease.worker, lease.grant
        assert grant is not None
        slots = self._slots(worker, grant.model)
        if slots is not None and max(seen + 1, worker.in_flight) > slots:
            await self._preempt(grant.model, frozenset(), grant.priority, "worker", {worker.name})

    async def _preempt(
        self, model: str, exclude: frozenset[str], priority: Priority, why: str, workers: set[str] | None = None
    ) -> bool:
        """A request of ``priority`` waits for a slot because ``why``: stop the batch request
        :func:`turnout.core.preemption.victim` names, if any (True: one was stopped), on ``workers`` (else any
        candidate not in ``exclude``), this process's or another's (through the occupancy, which tells the process
        running it). Its slot is given back as its request ends, which wakes the queue's first waiter."""
        if not self.routing.preempt_batch:
            return False
        running = self._running(model, self._elsewhere.get(model, ()))
        if not running:
            return False
        if workers is None:
            workers = {s.name for s in self.fleet.candidates(model)} - exclude
        chosen = victim(running, priority, why, model, workers)
        if chosen is None:
            return False
        if chosen.lease in self._stoppable:
            return self._stop(chosen.lease)
        self._elsewhere[model] = tuple(r for r in self._elsewhere.get(model, ()) if r.lease != chosen.lease)
        return await self.occupancy.stop(chosen)

    def _release(self, lease: Lease) -> None:
        if lease.grant is not None:
            self._stoppable.pop(lease.grant.lease, None)
        worker = lease.worker
        now = time.monotonic()
        if lease.first_at is not None:
            worker.ran(lease.requested, Span(lease.sent_at, lease.first_at, lease.last_at), now)
        worker.flown(now)
        worker.in_flight -= 1
        worker.completed += 1
        if lease.grant is not None:
            self.occupancy.give(lease.grant)

    def _saturated_retry_after(self) -> int:
        return max(1, math.ceil(min(self.routing.queue_timeout_s, 10) / 2))


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _slots_capped(view: WorkerView, worker: WorkerState) -> WorkerView:
    """``view`` as a batch request is routed: its worker capped at what its engine runs at once (where known), so
    that it waits in the gateway's queue, behind every other class, rather than in the engine's, where no later
    request passes it; except on an engine that orders its own queue by priority (``priority_scheduling``)."""
    if worker.config.priority_scheduling:
        return view
    capped = _least(view.max_concurrent, view.slots)
    return view if capped == view.max_concurrent else view._replace(max_concurrent=capped)


def _all_busy(model: str, views: list[WorkerView], exclude: frozenset[str]) -> bool:
    """Every worker that may serve ``model`` (healthy, allowed, holding it) runs as many requests as its engine
    runs at once (known)."""
    eligible = _eligible(model, views, exclude)
    if eligible is None:
        return False
    by_name = {v.name: v for v in views}
    return all((slots := by_name[w].slots) is not None and by_name[w].in_flight >= slots for w in eligible)


def _eligible(model: str, views: list[WorkerView], exclude: frozenset[str]) -> list[str] | None:
    """The workers that may serve ``model`` now (healthy, allowed, holding it), busy or not; None: no route."""
    every = route(model, [v._replace(max_concurrent=None) for v in views], exclude=exclude)
    return None if isinstance(every, NoRoute) else [c.worker for c in every.candidates]


def _without(
    stoppable: Mapping[str, list[Running]], counts: Mapping[str, int], backlogs: Mapping[str, Backlog]
) -> tuple[dict[str, int], dict[str, Backlog]]:
    """Requests in flight and backlogs per worker less the batch requests that would be stopped there."""
    fewer, lighter = dict(counts), dict(backlogs)
    for name, lines in stoppable.items():
        if name in fewer:
            fewer[name] = max(0, fewer[name] - len(lines))
        backlog = lighter.get(name)
        if backlog is not None:
            works = [r.work for r in lines if r.work is not None]
            lighter[name] = backlog._replace(
                work_s=max(0.0, backlog.work_s - sum(works)), ranked=max(0, backlog.ranked - len(works))
            )
    return fewer, lighter


def _restarting(state: WorkerState, now: float) -> bool:
    """Down, but healthy within :data:`RECENTLY_S` (monotonic ``now``): a restart, worth a wait."""
    return not state.healthy and state.healthy_at is not None and now - state.healthy_at <= RECENTLY_S


def no_route_error(decision: NoRoute, retry_after_s: int) -> TurnoutError:
    reason = decision.reason
    if reason is NoRouteReason.BLOCKED:
        return Forbidden(decision.message, code=reason.value)
    if reason in (NoRouteReason.UNKNOWN_MODEL, NoRouteReason.NOT_INSTALLED):
        return NotFound(decision.message, code=reason.value)
    if reason is NoRouteReason.NO_HEALTHY:
        return Unavailable(decision.message, code=reason.value, retry_after=retry_after_s)
    return Unavailable(decision.message, code=reason.value)
