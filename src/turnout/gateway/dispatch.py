"""Admission: route a request, hold its concurrency slots, queue it while everything is busy.

Wraps the pure router with the counters it needs (global, per model, per worker) and a bounded
FIFO queue per model. A waiter is woken when any slot is released or the fleet changes, re-runs
routing, and keeps its place at the head of its queue if it still cannot go.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass, replace

from turnout.config import Routing
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
    _dispatcher: Dispatcher
    _released: bool = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._dispatcher._release(self)


class Dispatcher:
    def __init__(self, fleet: Fleet, routing: Routing, metrics: Metrics, *, retry_after_s: int) -> None:
        self.fleet = fleet
        self.routing = routing
        self.metrics = metrics
        self.retry_after_s = retry_after_s
        self.global_in_flight = 0
        self.model_in_flight: dict[str, int] = {}
        self._limits = routing.model_limits()
        self._queues: dict[str, deque[asyncio.Future[None]]] = {}
        self._queued = 0
        self._rotation = 0
        self._routed = metrics.routing.labels("routed")

    async def acquire(self, model: str, exclude: frozenset[str] = frozenset()) -> Lease:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.routing.queue_timeout_s
        # FIFO: a newcomer does not overtake requests already waiting for the same model.
        waited = False
        if self._queues.get(model):
            await self._wait(model, deadline - loop.time(), front=False)
            waited = True
        while True:
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
                return self._take(self.fleet.workers[best.worker], best.model, model)
            if decision.reason is not NoRouteReason.SATURATED:
                self.metrics.routing.labels(decision.reason.value).inc()
                raise no_route_error(decision, self.retry_after_s)
            remaining = deadline - loop.time()
            if remaining <= 0 or (not waited and self._queued >= self.routing.max_queue):
                self.metrics.routing.labels("saturated").inc()
                if waited:
                    self.metrics.queue_wait.observe(loop.time() - started)
                why = "the wait queue is full" if remaining > 0 else f"waited {self.routing.queue_timeout_s:g}s"
                raise Unavailable(
                    f"{decision.message}; {why}", code="saturated", retry_after=self._saturated_retry_after()
                )
            await self._wait(model, remaining, front=waited)
            waited = True

    def locate(self, model: str) -> Route | NoRoute:
        """Route without taking or checking slots: for metadata calls such as ``/api/show``."""
        views = [replace(v, max_concurrent=None) for v in self.fleet.views(model)]
        return route(model, views)

    def wake_all(self) -> None:
        """Fleet changed (a worker came up, rules changed): let every queue head retry."""
        for queue in self._queues.values():
            _wake_head(queue)

    # -- internals -------------------------------------------------------------------------------
    def _take(self, worker: WorkerState, upstream_model: str, model: str) -> Lease:
        worker.in_flight += 1
        self.global_in_flight += 1
        self.model_in_flight[model] = self.model_in_flight.get(model, 0) + 1
        return Lease(worker, upstream_model, model, self)

    def _release(self, lease: Lease) -> None:
        lease.worker.in_flight -= 1
        self.global_in_flight -= 1
        left = self.model_in_flight[lease.requested] - 1
        if left:
            self.model_in_flight[lease.requested] = left
        else:
            del self.model_in_flight[lease.requested]
        # The freed slot may be the one any model was waiting for (global and worker slots are shared).
        own = self._queues.get(lease.requested)
        if own:
            _wake_head(own)
        for name, queue in self._queues.items():
            if name != lease.requested:
                _wake_head(queue)

    async def _wait(self, model: str, limit_s: float, *, front: bool) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._queues.setdefault(model, deque())
        if front:
            queue.appendleft(future)
        else:
            queue.append(future)
        self._queued += 1
        self.metrics.queued.inc()
        try:
            await asyncio.wait_for(future, limit_s)
        except TimeoutError:
            pass
        finally:
            self._queued -= 1
            self.metrics.queued.dec()
            if future in queue:
                queue.remove(future)
            if not queue:
                self._queues.pop(model, None)

    def _saturated_retry_after(self) -> int:
        return max(1, math.ceil(min(self.routing.queue_timeout_s, 10) / 2))


def _wake_head(queue: deque[asyncio.Future[None]]) -> None:
    for future in queue:
        if not future.done():
            future.set_result(None)
            return


def no_route_error(decision: NoRoute, retry_after_s: int) -> TurnoutError:
    reason = decision.reason
    if reason is NoRouteReason.BLOCKED:
        return Forbidden(decision.message, code=reason.value)
    if reason in (NoRouteReason.UNKNOWN_MODEL, NoRouteReason.NOT_INSTALLED):
        return NotFound(decision.message, code=reason.value)
    if reason is NoRouteReason.NO_HEALTHY:
        return Unavailable(decision.message, code=reason.value, retry_after=retry_after_s)
    return Unavailable(decision.message, code=reason.value)
