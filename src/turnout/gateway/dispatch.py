"""Admission: route a request, hold its concurrency slots, queue it while everything is busy.

Wraps the pure router with the counters it needs (global, per model, per worker, per tenant) and a
bounded wait queue per model. Inside a model's queue each tenant has its own FIFO line, and a freed
slot goes to the tenants in weighted round-robin (:mod:`turnout.core.fairness`), so one tenant's burst
cannot starve another. A woken waiter re-runs routing and keeps its place at the head of its line if it
still cannot go. A tenant at its ``max_concurrent`` waits without blocking other tenants.

Where a model has more than one candidate worker, the request's prompt (its parts as the worker will see them,
and the client's session, through the dialect: :class:`Ask`) is matched against each worker's prefix index and
the router ranks them by expected time (:mod:`turnout.core.routing`); the prompt is then recorded in the index of
the worker it goes to, at once, so that the next request of the same conversation follows it even while this
one runs (and, with `serve --workers N`, in the other processes' copies: :mod:`.shared_prefixes`). With a single
candidate none of this is computed.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from turnout.config import Routing, Tenant
from turnout.core.fairness import WeightedRoundRobin
from turnout.core.parallelism import Span
from turnout.core.patterns import best_value
from turnout.core.prefix import BYTES_PER_TOKEN, Prompt, prompt_of
from turnout.core.routing import (
    DEFAULT_OUTPUT_TOKENS,
    NO_DEMAND,
    Capacity,
    Demand,
    LoadGuard,
    NoRoute,
    NoRouteReason,
    Reason,
    Route,
    route,
)
from turnout.dialects import api
from turnout.dialects.base import Call
from turnout.errors import Forbidden, NotFound, TurnoutError, Unavailable
from turnout.fleet.state import Fleet, WorkerState
from turnout.gateway.shared_prefixes import SharedPrefixes
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
    work: float = 0.0  # its expected work on the worker (in the worker's backlog while it runs)
    # monotonic (loop) times: sent, and the engine seen working on it (first and last bytes of its answer's stream,
    # or the span its own timings give); they teach the worker's parallelism (:meth:`WorkerState.ran`)
    sent_at: float = 0.0
    first_at: float | None = None
    last_at: float = 0.0

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

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._dispatcher._release(self)


class _ModelQueue:
    """Waiters for one model: a FIFO line per tenant, served in weighted round-robin."""

    def __init__(self) -> None:
        self.lines: dict[str, deque[asyncio.Future[None]]] = {}
        self.turns = WeightedRoundRobin()

    def add(self, tenant: str, future: asyncio.Future[None], *, front: bool) -> None:
        line = self.lines.setdefault(tenant, deque())
        if front:
            line.appendleft(future)
        else:
            line.append(future)

    def remove(self, tenant: str, future: asyncio.Future[None]) -> None:
        line = self.lines.get(tenant)
        if line is not None and future in line:
            line.remove(future)
            if not line:
                del self.lines[tenant]

    def waiting(self, can_go: Callable[[str], bool]) -> bool:
        return any(can_go(t) and any(not f.done() for f in line) for t, line in self.lines.items())

    def wake_next(self, can_go: Callable[[str], bool], weight: Callable[[str], int]) -> None:
        ready = [t for t, line in self.lines.items() if can_go(t) and any(not f.done() for f in line)]
        tenant = self.turns.pick(ready, weight)
        if tenant is not None:
            for future in self.lines[tenant]:
                if not future.done():
                    future.set_result(None)
                    return

    def __bool__(self) -> bool:
        return bool(self.lines)


class Dispatcher:
    def __init__(
        self,
        fleet: Fleet,
        routing: Routing,
        metrics: Metrics,
        *,
        retry_after_s: int,
        tenants: Mapping[str, Tenant] | None = None,
    ) -> None:
        self.fleet = fleet
        self.routing = routing
        self.metrics = metrics
        self.retry_after_s = retry_after_s
        self.tenants = dict(tenants or {})
        self.global_in_flight = 0
        self.model_in_flight: dict[str, int] = {}
        self.tenant_in_flight: dict[str, int] = {}
        self._limits = routing.model_limits()
        self._queues: dict[str, _ModelQueue] = {}
        self._queued = 0
        self._rotation = 0
        self._routed = metrics.routing.labels("routed")
        self._reasons = metrics.route_reasons
        for reason in Reason:
            self._reasons[reason.value] = 0
        self._guard = LoadGuard(routing.load_guard_absolute, routing.load_guard_relative)
        self.shared: SharedPrefixes | None = None  # `serve --workers N`: the other processes record it too

    def _tenant_cap(self, tenant: str) -> int | None:
        cfg = self.tenants.get(tenant)
        return None if cfg is None else cfg.max_concurrent

    def _weight(self, tenant: str) -> int:
        cfg = self.tenants.get(tenant)
        return 1 if cfg is None else cfg.weight

    def _can_go(self, tenant: str) -> bool:
        cap = self._tenant_cap(tenant)
        return cap is None or self.tenant_in_flight.get(tenant, 0) < cap

    async def acquire(
        self,
        model: str,
        exclude: frozenset[str] = frozenset(),
        tenant: str = "",
        ask: Ask | None = None,
        *,
        priority: str = "standard",
    ) -> Lease:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.routing.queue_timeout_s
        waited = False
        # A newcomer does not overtake requests already waiting (and able to go) for the same model.
        queue = self._queues.get(model)
        if queue and queue.waiting(self._can_go):
            await self._wait(model, tenant, deadline - loop.time(), front=False)
            waited = True
        while True:
            cap = self._tenant_cap(tenant)
            if cap is not None and self.tenant_in_flight.get(tenant, 0) >= cap:
                message = f'tenant "{tenant}" is at its limit of {cap} concurrent requests'
            else:
                candidates = self.fleet.candidates(model)
                choice = len(candidates) > 1
                prompt, demand = self._demand(model, ask) if choice else (None, NO_DEMAND)
                decision = route(
                    model,
                    self.fleet.views(model, prompt, candidates),
                    Capacity(
                        global_in_flight=self.global_in_flight,
                        global_max=self.routing.max_concurrent,
                        model_in_flight=self.model_in_flight.get(model, 0),
                        model_max=best_value(model, self._limits),
                    ),
                    exclude=exclude,
                    rotation=self._rotation,
                    demand=demand,
                    guard=self._guard,
                )
                if not isinstance(decision, NoRoute):
                    if waited:
                        self.metrics.queue_wait.observe(loop.time() - started)
                    self._routed.inc()
                    self._reasons[decision.reason] += 1
                    self._rotation += 1
                    best = decision.best
                    lease = self._take(self.fleet.workers[best.worker], best.model, model, tenant)
                    if choice:  # (even when only one of them was free just now)
                        self._placed(lease, decision, prompt, time.monotonic())
                    return lease
                if decision.reason is not NoRouteReason.SATURATED:
                    self.metrics.routing.labels(decision.reason.value).inc()
                    raise no_route_error(decision, self.retry_after_s)
                message = decision.message
            remaining = deadline - loop.time()
            if remaining <= 0 or (not waited and self._queued >= self.routing.max_queue):
                self.metrics.routing.labels("saturated").inc()
                if waited:
                    self.metrics.queue_wait.observe(loop.time() - started)
                why = "the wait queue is full" if remaining > 0 else f"waited {self.routing.queue_timeout_s:g}s"
                raise Unavailable(f"{message}; {why}", code="saturated", retry_after=self._saturated_retry_after())
            await self._wait(model, tenant, remaining, front=waited)
            waited = True

    def locate(self, model: str) -> Route | NoRoute:
        """Route without taking or checking slots: for metadata calls such as ``/api/show``."""
        views = [v._replace(max_concurrent=None) for v in self.fleet.views(model)]
        return route(model, views)

    def wake_all(self) -> None:
        """Fleet changed (a worker came up, rules changed): let every queue's next waiter retry."""
        for queue in self._queues.values():
            queue.wake_next(self._can_go, self._weight)

    # -- internals -------------------------------------------------------------------------------
    def _demand(self, model: str, ask: Ask | None) -> tuple[Prompt | None, Demand]:
        """The request's prompt (when prefix affinity is on) and what it asks of a worker."""
        if ask is None:
            return None, NO_DEMAND
        prompt = ask.prompt(self.routing.prefix_block_bytes) if self.routing.prefix_affinity else None
        size = prompt.size if prompt is not None else len(ask.call.body)
        return prompt, Demand(size, ask.output_tokens(self.fleet.completion.get(model)))

    def _placed(self, lease: Lease, decision: Route, prompt: Prompt | None, now: float) -> None:
        """A request for a model with several candidate workers goes to ``lease.worker``: why, what it holds, and
        its prompt recorded in that worker's prefix index at once (the engine will hold it once it starts)."""
        worker = lease.worker
        lease.why = decision.why
        lease.choice = True
        slots = worker.parallelism(lease.requested, now).slots
        lease.queued = slots is not None and worker.in_flight > slots
        lease.work = decision.best.work
        worker.ranked_in_flight += 1
        worker.backlog_s += lease.work
        if prompt is None:
            return
        lease.prompt = prompt
        cached = decision.best.cached
        lease.share = min(cached / prompt.size, 1.0) if prompt.size else 0.0
        worker.prefix.record(prompt, now)
        if self.shared is not None:
            self.shared.recorded(worker.name, prompt)
        worker.routed(prompt.size / BYTES_PER_TOKEN, cached / BYTES_PER_TOKEN)
        self.metrics.prefix_tokens(worker.name, prompt.size / BYTES_PER_TOKEN, cached / BYTES_PER_TOKEN)

    def _take(self, worker: WorkerState, upstream_model: str, model: str, tenant: str) -> Lease:
        worker.in_flight += 1
        self.global_in_flight += 1
        self.model_in_flight[model] = self.model_in_flight.get(model, 0) + 1
        self.tenant_in_flight[tenant] = self.tenant_in_flight.get(tenant, 0) + 1
        now = time.monotonic()
        worker.sent_at.append(now)
        return Lease(worker, upstream_model, model, tenant, self, sent_at=now)

    def _release(self, lease: Lease) -> None:
        worker = lease.worker
        worker.sent_at.remove(lease.sent_at)
        if lease.first_at is not None:
            worker.ran(lease.requested, Span(lease.sent_at, lease.first_at, lease.last_at), time.monotonic())
        if lease.choice:
            lease.worker.ranked_in_flight -= 1
            lease.worker.backlog_s = (
                max(lease.worker.backlog_s - lease.work, 0.0) if lease.worker.ranked_in_flight else 0.0
            )
        lease.worker.in_flight -= 1
        lease.worker.completed += 1
        self.global_in_flight -= 1
        _decrement(self.model_in_flight, lease.requested)
        _decrement(self.tenant_in_flight, lease.tenant)
        # The freed slot may be the one any model was waiting for (global, worker and tenant slots are shared).
        own = self._queues.get(lease.requested)
        if own:
            own.wake_next(self._can_go, self._weight)
        for name, queue in self._queues.items():
            if name != lease.requested:
                queue.wake_next(self._can_go, self._weight)

    async def _wait(self, model: str, tenant: str, limit_s: float, *, front: bool) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._queues.setdefault(model, _ModelQueue())
        queue.add(tenant, future, front=front)
        self._queued += 1
        self.metrics.queued.inc()
        try:
            await asyncio.wait_for(future, limit_s)
        except TimeoutError:
            pass
        finally:
            self._queued -= 1
            self.metrics.queued.dec()
            queue.remove(tenant, future)
            if not queue:
                self._queues.pop(model, None)

    def _saturated_retry_after(self) -> int:
        return max(1, math.ceil(min(self.routing.queue_timeout_s, 10) / 2))


def _decrement(counts: dict[str, int], name: str) -> None:
    left = counts[name] - 1
    if left:
        counts[name] = left
    else:
        del counts[name]


def no_route_error(decision: NoRoute, retry_after_s: int) -> TurnoutError:
    reason = decision.reason
    if reason is NoRouteReason.BLOCKED:
        return Forbidden(decision.message, code=reason.value)
    if reason in (NoRouteReason.UNKNOWN_MODEL, NoRouteReason.NOT_INSTALLED):
        return NotFound(decision.message, code=reason.value)
    if reason is NoRouteReason.NO_HEALTHY:
        return Unavailable(decision.message, code=reason.value, retry_after=retry_after_s)
    return Unavailable(decision.message, code=reason.value)
