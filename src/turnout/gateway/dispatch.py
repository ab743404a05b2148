"""Admission: route a request, hold its concurrency slots, queue it while everything is busy.

Wraps the pure router with the counters it needs (global, per model, per worker, per tenant) and a
bounded wait queue per model. Inside a model's queue each tenant has its own FIFO line, and a freed
slot goes to the tenants in weighted round-robin (:mod:`turnout.core.fairness`), so one tenant's burst
cannot starve another. A woken waiter re-runs routing and keeps its place at the head of its line if it
still cannot go. A tenant at its ``max_concurrent`` waits without blocking other tenants.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from turnout.config import Routing, Tenant
from turnout.core.fairness import WeightedRoundRobin
from turnout.core.patterns import best_value
from turnout.core.routing import Capacity, NoRoute, NoRouteReason, Route, route
from turnout.errors import Forbidden, NotFound, TurnoutError, Unavailable
from turnout.fleet.state import Fleet, WorkerState
from turnout.metrics import Metrics

__all__ = ["Dispatcher", "Lease", "no_route_error"]


@dataclass(slots=True)
class Lease:
    """Slots held by one attempt on one worker; release exactly once."""

    worker: WorkerState
    model: str  # name sent upstream
    requested: str
    tenant: str
    _dispatcher: Dispatcher
    _released: bool = False

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

    def _tenant_cap(self, tenant: str) -> int | None:
        cfg = self.tenants.get(tenant)
        return None if cfg is None else cfg.max_concurrent

    def _weight(self, tenant: str) -> int:
        cfg = self.tenants.get(tenant)
        return 1 if cfg is None else cfg.weight

    def _can_go(self, tenant: str) -> bool:
        cap = self._tenant_cap(tenant)
        return cap is None or self.tenant_in_flight.get(tenant, 0) < cap

    async def acquire(self, model: str, exclude: frozenset[str] = frozenset(), tenant: str = "") -> Lease:
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
                decision = route(
                    model,
                    self.fleet.views(model),
                    Capacity(
                        global_in_flight=self.global_in_flight,
                        global_max=self.routing.max_concurrent,
                        model_in_flight=self.model_in_flight.get(model, 0),
                        model_max=best_value(model, self._limits),
                    ),
                    exclude=exclude,
                    rotation=self._rotation,
                )
                if not isinstance(decision, NoRoute):
                    if waited:
                        self.metrics.queue_wait.observe(loop.time() - started)
                    self._routed.inc()
                    self._rotation += 1
                    best = decision.best
                    return self._take(self.fleet.workers[best.worker], best.model, model, tenant)
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
    def _take(self, worker: WorkerState, upstream_model: str, model: str, tenant: str) -> Lease:
        worker.in_flight += 1
        self.global_in_flight += 1
        self.model_in_flight[model] = self.model_in_flight.get(model, 0) + 1
        self.tenant_in_flight[tenant] = self.tenant_in_flight.get(tenant, 0) + 1
        return Lease(worker, upstream_model, model, tenant, self)

    def _release(self, lease: Lease) -> None:
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
