"""Batch requests offered to stop across processes (turnout.gateway.occupancy's ``offer`` and ``stop``): what one
process offers is in the other processes' views, once, and stopped by the one that claims it; given back (or its
replica gone), it is withdrawn. The supervisor's keeper (`serve --workers N`, over its wire format) and Redis (a
real redis-server, two replicas) keep the same rules; one process alone offers nothing to itself."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.conftest import eventually
from tests.gateway.test_occupancy import TENANT_CAPS, Wires, grant, indexes, redis_keeper
from turnout.core.admission import Priority
from turnout.core.preemption import Running
from turnout.gateway import redis_occupancy
from turnout.gateway.occupancy import LocalOccupancy, Occupancy

WORKERS = ["w1", "w2"]


@pytest.fixture(params=["supervised", "redis"])
async def pair(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[tuple[Occupancy, Occupancy]]:
    if request.param == "supervised":
        wires = Wires()
        yield wires.process(7), wires.process(8)
        return
    prefix = f"t{uuid.uuid4().hex[:8]}"
    a, b = redis_keeper(redis_url, prefix), redis_keeper(redis_url, prefix)
    await a.start()
    await b.start()
    await asyncio.sleep(0.2)  # both subscribed to the stop channel
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def _offered(keeper: Occupancy, model: str = "m") -> tuple[Running, ...]:
    return (await keeper.view(model, "", WORKERS, None, None, {})).stoppable


async def test_a_line_one_process_offers_is_stopped_once_by_another(pair: tuple[Occupancy, Occupancy]) -> None:
    a, b = pair
    line = grant("w1", priority=Priority.BATCH, work=0.5)
    assert await a.take(line) is None
    stopped: list[str] = []
    a.offer(line, time.monotonic(), lambda: stopped.append(line.lease))
    seen = await eventually(lambda: _offered(b), "b to see a's line")
    assert [(r.lease, r.worker, r.model, r.work) for r in seen] == [(line.lease, "w1", "m", 0.5)]
    assert 0 <= time.monotonic() - seen[0].since < 5  # in b's own monotonic seconds: it started just now
    assert await _offered(a) == ()  # a's own lines are its dispatcher's
    assert await _offered(b, "other") == ()  # another model's view
    assert (await b.view("m", "", ["w2"], None, None, {})).stoppable == ()  # another worker's
    assert (await b.view("m", "", WORKERS, None, None, {}, offers=False)).stoppable == ()  # not asked for
    assert await b.stop(seen[0]) is True
    await eventually(lambda: _true(stopped), "a to hear the stop", 5)
    assert stopped == [line.lease]
    assert await b.stop(seen[0]) is False  # claimed once: a second request stops nothing
    assert await _offered(b) == ()
    a.give(line)
    await a.settle()
    assert stopped == [line.lease]


async def test_a_line_given_back_is_no_longer_offered(pair: tuple[Occupancy, Occupancy]) -> None:
    a, b = pair
    line = grant("w1", priority=Priority.BATCH)
    assert await a.take(line) is None
    stopped: list[str] = []
    a.offer(line, time.monotonic(), lambda: stopped.append(line.lease))
    [seen] = await eventually(lambda: _offered(b), "b to see a's line")
    a.give(line)
    await a.settle()
    assert await _offered(b) == ()
    assert await b.stop(seen) is False
    await asyncio.sleep(0.2)
    assert stopped == []


async def test_one_process_offers_nothing_to_itself() -> None:
    keeper = LocalOccupancy(indexes(), clock=time.monotonic, tenant_caps=TENANT_CAPS)
    line = grant("w1", priority=Priority.BATCH)
    assert await keeper.take(line) is None
    keeper.offer(line, time.monotonic(), lambda: None)
    assert await _offered(keeper) == ()
    assert await keeper.stop(Running(line.lease, "w1", "m", time.monotonic())) is False


async def test_a_dead_replicas_lines_are_not_offered(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica killed while running a line: the line's lease expires with it, and so does its offer."""
    monkeypatch.setattr(redis_occupancy, "LEASE_S", 0.4)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    dead, alive = redis_keeper(redis_url, prefix), redis_keeper(redis_url, prefix)
    line = grant("w1", priority=Priority.BATCH)
    assert await dead.take(line) is None  # never started: nothing renews it
    dead.offer(line, time.monotonic(), lambda: None)
    await alive.start()
    try:
        [seen] = await eventually(lambda: _offered(alive), "the line to be offered")
        await asyncio.sleep(0.5)
        assert await _offered(alive) == ()
        assert await alive.stop(seen) is False
    finally:
        await alive.close()
        await dead.close()


async def test_lines_offered_while_redis_was_away_are_offered_once_it_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.support.services import redis_server

    monkeypatch.setattr(redis_occupancy, "RETRY_S", 0.1)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    with redis_server() as url:
        port = url.rsplit(":", 1)[1].split("/")[0]
        other = redis_keeper(url, prefix)
        keeper = redis_keeper(url, prefix)
        await keeper.start()
        await other.start()
        line = grant("w1", priority=Priority.BATCH)
        assert await keeper.take(line) is None
    try:
        await eventually(lambda: _true(not keeper.up), "the keeper to notice Redis away", 10)
        keeper.offer(line, time.monotonic(), lambda: None)
        with redis_server(port=int(port)):  # back, empty
            await eventually(lambda: _true(keeper.up and other.up), "both back", 20)
            [seen] = await eventually(lambda: _offered(other), "the line offered again", 10)
            assert seen.lease == line.lease
    finally:
        await keeper.close()
        await other.close()


async def _true(value: Any) -> Any:
    return value or None
