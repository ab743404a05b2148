"""The wake a 503 ``model_waking`` promises (issue 32, item 14), against a scripted claim source and agent: it
waits for a sleep under way, is sent again when the agent refuses it (its Redis key given back first), and gives
up once the claim no longer says Sleeping. The real agent and engine: tests/runtime/test_gateway_wake.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from tests.conftest import eventually
from turnout.controller.claim_sources import WakeTarget
from turnout.core.claims import ClaimPhase
from turnout.fleet.claims import ClaimBindings


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
