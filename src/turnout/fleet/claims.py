"""ModelClaim bindings in the gateway: each claim's engine is an upstream while it is Active.

The bindings follow the claims' routing annotations (a port only while the engine is active and ready) the
moment the controller changes one, and the statuses after every tick. A request for a claimed model that is
not Active is answered without touching the engine: Sleeping -> one asynchronous wake per sleep and 503 with
``Retry-After: 10``; Pending/Scheduling/Loading/Activating -> 503 with ``Retry-After``; Failed -> 503 without.
The gateway never holds or replays the request.

One wake per sleep: a wake is keyed on the sleep itself (pod, model and the time the engine went to sleep, as
its agent reports it now), and only an engine the agent reports sleeping is woken. A key this replica already
woke is never woken again, however many requests and retries arrive and whether or not the first wake is still
running; across gateway replicas the first to set the key in Redis sends it. Once this replica has sent (or
seen another send) the wake of the claim's sleep, a later wake task that finds the engine no longer asleep is done
at once: the sleep it follows is over, and the engine is on its way up, whether or not a controller tick has turned
the claim's status yet.

Every answer that says a wake is under way has one under way: the claim turns Sleeping (its route is taken away)
before its engine is put to sleep, so a request in between finds an engine that is not asleep yet. The wake then
waits for the sleep (asking the agent again, more slowly each time, for at most :data:`WAKE_WAIT_S`, while the
claim still says Sleeping) and wakes the engine as soon as it sleeps; a wake the agent refused is sent again
the same way (and its Redis key given back first, so that it is this replica's to send).

Claimed models are listed in ``/v1/models`` and ``/api/tags`` (``Fleet.claim_listing``) while their claim is
placed and not Failed, asleep included: clients such as OpenWebUI only offer what is listed, and a request for a
sleeping model is what wakes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

from turnout.config import Worker
from turnout.controller.claim_sources import ClaimSource
from turnout.core.claims import ClaimPhase
from turnout.core.engines import FAMILIES
from turnout.core.lifecycle import RETRY_AFTER_S
from turnout.errors import TurnoutError, Unavailable
from turnout.fleet.poller import adopt_family
from turnout.fleet.state import Fleet

__all__ = ["ClaimBindings"]

log = logging.getLogger("turnout.claims")

# Claims whose model is not listed: given up (Failed), or nowhere to run (no pod: Scheduling without one, or
# Pending as earlier Turnout wrote it).
_UNLISTED = frozenset({ClaimPhase.PENDING, ClaimPhase.FAILED})
# Retry-After of a claimed model asleep, or on its way up: as AIBrix's gateway answers every claim not yet routable
# (modelClaimRetryAfterSeconds); a woken engine stays awake twice as long (core.lifecycle.WOKEN_HOLD_S)
SLEEPING_RETRY_S = RETRY_AFTER_S
ACTIVATING_RETRY_S = RETRY_AFTER_S
WAKE_KEY_TTL_S = 120
WAKE_WAIT_S = 60.0  # how long a wake waits for the sleep it follows (a vLLM sleep, an engine stopping) to end
_WAKE_POLL_S = (0.1, 1.0)  # the agent is asked again after the first of these, doubling up to the second


class WakeLock(Protocol):
    """Decides which gateway replica sends a wake: True for exactly one caller per key."""

    async def first(self, key: str) -> bool: ...

    async def release(self, key: str) -> None:
        """Give ``key`` back (its wake was refused): the next :meth:`first` for it is True again."""
        ...


class RedisWakeLock:
    def __init__(self, url: str) -> None:
        import redis.asyncio as redis

        self._redis = redis.from_url(url)

    async def first(self, key: str) -> bool:
        import redis.exceptions

        try:
            return bool(await self._redis.set(f"turnout:wake:{key}", b"1", nx=True, ex=WAKE_KEY_TTL_S))
        except redis.exceptions.RedisError as exc:
            log.warning("wake de-duplication through Redis failed (%s); waking from this replica", exc)
            return True

    async def release(self, key: str) -> None:
        import redis.exceptions

        try:
            await self._redis.delete(f"turnout:wake:{key}")
        except redis.exceptions.RedisError as exc:
            log.warning("could not give back the wake key of %s through Redis (%s)", key, exc)

    async def close(self) -> None:
        await self._redis.aclose()


class ClaimBindings:
    def __init__(
        self,
        fleet: Fleet,
        source: ClaimSource,
        interval_s: float,
        wake_lock: WakeLock | None = None,
    ) -> None:
        self.fleet = fleet
        self.source = source
        self.interval_s = interval_s
        self.wake_lock = wake_lock
        self.phases: dict[str, tuple[str, ClaimPhase]] = {}  # model -> (claim key, phase)
        self._wakes: dict[str, asyncio.Task[None]] = {}
        self._woken: dict[str, str] = {}  # model -> the sleep this replica last woke it from
        # models whose sleep this replica saw woken since their claim last turned Sleeping (reset when it stops)
        self._woken_while_sleeping: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._completed: dict[str, int] = {}  # claim -> requests finished on its engine (idle detection)
        self.on_change: Callable[[], None] | None = None
        self.wakes_sent = 0
        source.on_route_change = self.sync
        source.activity = self.activity

    @staticmethod
    def worker_name(key: str) -> str:
        return "claim-" + key.replace("/", ".")

    def activity(self, claim: str) -> tuple[int, int] | None:
        """Requests in flight on the claim's engine and finished so far, as this gateway counted them."""
        state = self.fleet.workers.get(self.worker_name(claim))
        if state is None:
            return None
        return state.in_flight, self._completed.get(claim, 0) + state.completed

    def sync(self) -> None:
        seen: set[str] = set()
        listing: dict[str, dict[str, Any]] = {}
        for view in self.source.views():
            if view.model in seen:
                log.warning("model %s is claimed twice; %s is ignored", view.model, view.key)
                continue
            seen.add(view.model)
            self.phases[view.model] = (view.key, view.phase)
            if view.phase is not ClaimPhase.SLEEPING:
                self._woken_while_sleeping.discard(view.model)
            if view.placed and view.phase not in _UNLISTED:
                listing[view.model] = {"id": view.model, "object": "model", "owned_by": f"claim/{view.key}"}
            if view.route is None:
                self._unbind(view.model)
                continue
            host, port = view.route
            url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
            current = self.fleet.bindings.get(view.model)
            if current is None or current.base_url != url:
                self._unbind(view.model)
                worker = Worker.model_validate({"name": self.worker_name(view.key), "url": url, "type": "openai"})
                state = self.fleet.state_for(worker, claim=view.key)
                state.inventory = state.loaded = frozenset({view.model})
                adopt_family(state, view.engine if view.engine in FAMILIES else None)
                state.tags = {view.model: {"id": view.model, "object": "model", "owned_by": f"claim/{view.key}"}}
                self.fleet.workers[state.name] = state
                self.fleet.bindings[view.model] = state
            self.fleet.bindings[view.model].healthy = True
        for model in list(self.phases):
            if model not in seen:
                self.phases.pop(model)
                self._woken.pop(model, None)
                self._woken_while_sleeping.discard(model)
                self._unbind(model)
        self.fleet.claim_listing = listing
        if self.on_change is not None:
            self.on_change()

    def _unbind(self, model: str) -> None:
        state = self.fleet.bindings.pop(model, None)
        if state is not None:
            self.fleet.workers.pop(state.name, None)
            if state.claim is not None:  # keep the count going across re-binds
                self._completed[state.claim] = self._completed.get(state.claim, 0) + state.completed

    def claimed(self, model: str) -> bool:
        return model in self.phases

    def refusal(self, model: str, *, unreachable: bool = False) -> Unavailable | None:
        """The claim's own 503 for a claimed model that cannot be served now, or None for a model no claim
        holds. ``unreachable``: its engine just refused a connection or its binding is down, which happens
        in the moment between a de-route and the status saying so (a sleep, a restart, a spec change): that
        is answered as a wake in progress, never with the generic no-route 503."""
        known = self.phases.get(model)
        if known is None:
            return None
        claim, phase = known
        if phase is ClaimPhase.ACTIVE and unreachable:
            return Unavailable(
                f'model "{model}" is changing state (claim {claim}); retry shortly',
                code="model_waking",
                retry_after=SLEEPING_RETRY_S,
            )
        if phase is ClaimPhase.SLEEPING:
            self._wake_once(claim, model)
            return Unavailable(
                f'model "{model}" is asleep; it is being woken, retry shortly',
                code="model_waking",
                retry_after=SLEEPING_RETRY_S,
            )
        if phase is ClaimPhase.FAILED:
            return Unavailable(
                f'model "{model}" failed to start (claim {claim}); see its status and events', code="model_failed"
            )
        if phase is ClaimPhase.ACTIVE:  # bound and reachable as far as this gateway knows: nothing to refuse
            return None
        return Unavailable(
            f'model "{model}" is {phase.value.lower()}; retry shortly',
            code="model_activating",
            retry_after=ACTIVATING_RETRY_S,
        )

    def _wake_once(self, claim: str, model: str) -> None:
        running = self._wakes.get(model)
        if running is not None and not running.done():
            return  # it is looking at this sleep already (the key below decides; this only saves a lookup)
        self._wakes[model] = asyncio.create_task(self._wake(claim, model), name=f"wake-{model}")

    async def _wake(self, claim: str, model: str) -> None:
        """Wake the claim's engine once it sleeps (see the module's docstring): until a wake is sent (or another
        replica sends it, or the engine is up after one), the claim stops saying Sleeping, or :data:`WAKE_WAIT_S` has
        passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAKE_WAIT_S
        pause, longest = _WAKE_POLL_S
        while not await self._wake_sleep(claim, model):
            if self.phases.get(model, ("", None))[1] is not ClaimPhase.SLEEPING or loop.time() >= deadline:
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, longest)

    async def _wake_sleep(self, claim: str, model: str) -> bool:
        """Wake the engine's current sleep: True once a wake for it is sent (here, or by another replica), or when
        the engine is no longer asleep after one; False when the engine does not sleep yet or its agent refused the
        wake."""
        target = await self.source.wake_target(claim)
        if target is None:
            # not asleep: no longer (this replica saw its sleep woken while the claim said Sleeping; the status
            # turns at the controller's next tick), or not yet (the sleep is under way)
            return model in self._woken_while_sleeping
        key = f"{target.pod}:{target.model}:{target.sleep_id}"
        if self._woken.get(model) == key:
            return True  # this sleep was woken already; the engine is coming back
        self._woken[model] = key
        self._woken_while_sleeping.add(model)
        if self.wake_lock is not None and not await self.wake_lock.first(key):
            return True  # another replica sends it
        self.wakes_sent += 1
        body = {"model_name": target.model, "operation_id": f"wake-{key}"}
        problem = await self.source.agents.post(target.agent_url, target.pod, "/v1/runtime/models/wake", body)
        if problem is None:
            return True
        if self._woken.get(model) == key:
            del self._woken[model]  # not woken after all: sent again
        self._woken_while_sleeping.discard(model)
        if self.wake_lock is not None:
            await self.wake_lock.release(key)
        return False

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="turnout-claims")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._wakes.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if isinstance(self.wake_lock, RedisWakeLock):
            await self.wake_lock.close()

    async def _loop(self) -> None:
        while True:
            try:
                await self.source.refresh()
                self.sync()
            except TurnoutError as exc:
                log.warning("claims tick failed: %s", exc.message)
            except Exception:
                log.exception("claims tick failed")
            await asyncio.sleep(self.interval_s)
