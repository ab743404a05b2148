"""The wake a 503 ``model_waking`` promises (issue 32, item 14), against a scripted claim source and agent: it
waits for a sleep under way, is sent again when the agent refuses it (its Redis key given back first), and gives
up once the claim no longer says Sleeping, or once the engine is up after the wake it sent (whatever the status says
until the controller's next tick). The real agent and engine: tests/runtime/test_gateway_wake.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import eventually
from turnout.config import Settings
from turnout.controller.claim_sources import ClaimView, WakeTarget
from turnout.core.claims import ClaimPhase
from turnout.fleet.claims import ClaimBindings
from turnout.fleet.state import Fleet
from turnout.state.placement_store import PlacementStore


class Agents:
    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.wakes: list[dict[str, Any]] = []

    async def post(self, url: str, pod: str, path: str, body: dict[str, Any]) -> str | None:
        self.wakes.append(body)
        if self.refusals:
            self.refusals -= 1
            return "engine busy"
        return None


class Source:
    """A claim whose engine falls asleep after ``awake`` looks (a sleep under way before that)."""

    def __init__(self, awake: int, refusals: int = 0) -> None:
        self.awake = awake
        self.looks = 0
        self.agents = Agents(refusals)
        self.on_route_change: Callable[[], None] | None = None
        self.activity: Any = None

    async def wake_target(self, key: str) -> WakeTarget | None:
        self.looks += 1
        return None if self.looks <= self.awake else WakeTarget("http://agent", "pod-0", "alpha", "t1")


class Waking(Source):
    """A claim whose engine sleeps (``sleep_id``, None while awake) until its agent takes a wake; the claim's phase
    is what the controller last wrote (``views``), which lags the engine until the test says otherwise."""

    def __init__(self) -> None:
        super().__init__(awake=0)
        self.sleep_id: str | None = "t1"
        self.phase = ClaimPhase.SLEEPING
        self.agents.post = self.wake  # type: ignore[method-assign]

    async def wake(self, url: str, pod: str, path: str, body: dict[str, Any]) -> str | None:
        self.agents.wakes.append(body)
        self.sleep_id = None  # the agent's wake returns with the engine booting
        return None

    async def wake_target(self, key: str) -> WakeTarget | None:
        self.looks += 1
        return None if self.sleep_id is None else WakeTarget("http://agent", "pod-0", "alpha", self.sleep_id)

    def views(self) -> list[ClaimView]:
        return [ClaimView("alpha", "alpha", self.phase, None, True)]


class Lock:
    def __init__(self) -> None:
        self.taken: set[str] = set()
        self.released: list[str] = []

    async def first(self, key: str) -> bool:
        if key in self.taken:
            return False
        self.taken.add(key)
        return True

    async def release(self, key: str) -> None:
        self.released.append(key)
        self.taken.discard(key)


def bindings(source: Source, lock: Lock | None = None) -> ClaimBindings:
    claims = ClaimBindings(None, source, 1.0, lock)  # type: ignore[arg-type]  # the fleet is not touched here
    claims.phases["alpha"] = ("alpha", ClaimPhase.SLEEPING)
    return claims


async def test_a_wake_waits_for_the_sleep_under_way() -> None:
    source = Source(awake=3)
    claims = bindings(source)
    refusal = claims.refusal("alpha")
    assert refusal is not None and refusal.code == "model_waking"
    await asyncio.wait_for(claims._wakes["alpha"], 10)
    assert source.looks == 4 and source.agents.wakes == [{"model_name": "alpha", "operation_id": "wake-pod-0:alpha:t1"}]
    assert claims.wakes_sent == 1
    claims.refusal("alpha")  # the same sleep: not woken twice
    await asyncio.wait_for(claims._wakes["alpha"], 10)
    assert claims.wakes_sent == 1


async def test_a_refused_wake_is_sent_again_and_its_key_given_back() -> None:
    source, lock = Source(awake=0, refusals=2), Lock()
    claims = bindings(source, lock)
    claims.refusal("alpha")
    await asyncio.wait_for(claims._wakes["alpha"], 10)
    assert len(source.agents.wakes) == 3 and claims.wakes_sent == 3
    assert lock.released == ["pod-0:alpha:t1"] * 2 and lock.taken == {"pod-0:alpha:t1"}


async def test_a_claim_that_stops_saying_sleeping_is_not_woken() -> None:
    source = Source(awake=10**6)
    claims = bindings(source)
    claims.refusal("alpha")

    async def looked_twice() -> bool:
        return source.looks >= 2

    await eventually(looked_twice, "the wake to look at the engine twice", 10, every_s=0.05)
    claims.phases["alpha"] = ("alpha", ClaimPhase.ACTIVE)  # the sleep failed and the route came back
    await asyncio.wait_for(claims._wakes["alpha"], 10)
    assert source.agents.wakes == [] and claims.wakes_sent == 0


async def woken_once() -> tuple[Waking, ClaimBindings]:
    """A scripted source whose claim "alpha" sleeps, and the bindings, after the wake a first refusal sent."""
    source = Waking()
    fleet = Fleet(Settings(), PlacementStore(Path("/nonexistent/model-placement.json")))
    claims = ClaimBindings(fleet, source, 1.0)  # type: ignore[arg-type]  # scripted source
    claims.sync()
    claims.refusal("alpha")
    await asyncio.wait_for(claims._wakes["alpha"], 10)
    return source, claims


async def test_a_wake_after_the_engine_woke_ends_at_its_first_look() -> None:
    """The status still says Sleeping (no controller tick yet) while the engine boots from the wake this replica
    sent: a retry's wake task looks once and is done, instead of asking the agent until the status turns or
    WAKE_WAIT_S (60 s) passes. A new sleep (the claim Active, then Sleeping again) is woken again."""
    source, claims = await woken_once()
    assert claims.wakes_sent == 1 and source.looks == 1
    for retry in range(3):
        claims.refusal("alpha")  # still Sleeping: the engine is up, or on its way
        await asyncio.wait_for(claims._wakes["alpha"], 10)
        assert source.looks == 2 + retry and claims.wakes_sent == 1

    source.phase = ClaimPhase.ACTIVE  # the controller's tick: the engine serves
    claims.sync()
    source.phase, source.sleep_id = ClaimPhase.SLEEPING, "t2"  # a new sleep
    claims.sync()
    claims.refusal("alpha")
    await asyncio.wait_for(claims._wakes["alpha"], 10)
    assert claims.wakes_sent == 2
    assert [w["operation_id"] for w in source.agents.wakes] == ["wake-pod-0:alpha:t1", "wake-pod-0:alpha:t2"]


async def test_after_the_claim_was_active_a_wake_waits_for_the_next_sleep() -> None:
    """The claim turns Sleeping again before its engine sleeps (the pool policy takes the route first): the earlier
    wake does not count for this sleep; the task waits for it and wakes it."""
    source, claims = await woken_once()
    source.phase = ClaimPhase.ACTIVE
    claims.sync()
    source.phase = ClaimPhase.SLEEPING  # the route taken away; the engine still awake
    claims.sync()
    claims.refusal("alpha")

    async def looked_again() -> bool:
        return source.looks >= 3

    await eventually(looked_again, "the wake to look at the engine, still awake, twice", 10, every_s=0.05)
    assert claims.wakes_sent == 1 and not claims._wakes["alpha"].done()
    source.sleep_id = "t2"  # the policy's sleep
    await asyncio.wait_for(claims._wakes["alpha"], 10)
    assert claims.wakes_sent == 2
