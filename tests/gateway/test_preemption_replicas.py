"""A batch request running on one replica is stopped for an interactive request another replica routes (Redis:
turnout.gateway.redis_occupancy's offers and ``P:stop``), as one gateway stops its own
(tests/gateway/test_preemption.py): two gateways on one real redis-server, the same one-slot engines (the Ollama
emulator)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.conftest import EmulatorFactory, Gateway, GatewayFactory, eventually, worker
from tests.gateway.test_batches import FAST, finished, jsonl, lines_of
from tests.gateway.test_preemption import MODEL, Stops, _line, _metrics
from tests.support.services import redis_server
from turnout.core.admission import Priority
from turnout.gateway.dispatch import Dispatcher
from turnout.gateway.keys import DISPATCHER


@pytest.fixture
def own_redis() -> Iterator[str]:
    with redis_server() as url:  # (its own: the shared one's default prefix holds other tests' leases)
        yield url


async def _replicas(
    gateway: GatewayFactory, tmp_path: Path, url: str, workers: list[dict[str, Any]], **sections: Any
) -> list[Gateway]:
    made = []
    for n in range(2):
        storage = {"data_dir": str(tmp_path / f"replica{n}"), "redis_url": url}
        made.append(await gateway(workers, storage=storage, **sections))
    return made


async def _offered(dispatcher: Dispatcher, count: int) -> None:
    async def seen() -> bool:
        held = await dispatcher.occupancy.view(MODEL, "", ["a", "b", "c"], None, None, {})
        return len(held.stoppable) == count

    await eventually(seen, f"{count} lines offered in Redis", 10)


async def test_a_request_on_one_replica_stops_the_line_another_replica_started_last(
    emulator: EmulatorFactory, gateway: GatewayFactory, tmp_path: Path, own_redis: str
) -> None:
    """Nothing capped (the default): every one-slot engine runs a batch line of replica one; an interactive request
    reaching replica two is ranked as if the line that started last were stopped, goes there, and stops it (and no
    other), through Redis; then a standard request stops the next."""
    emus = [await emulator(name, [MODEL]) for name in "abc"]
    one, two = await _replicas(gateway, tmp_path, own_redis, [worker(e.name, e.url, slots=1) for e in emus])
    first, second = one.app[DISPATCHER], two.app[DISPATCHER]
    stops = Stops()
    batch = []
    for n in range(3):
        batch.append(await first.acquire(MODEL, priority=Priority.BATCH, stop=stops.to(str(n))))
        await asyncio.sleep(0.01)  # (each starts after the one before)
    assert len({lease.worker.name for lease in batch}) == 3
    await _offered(second, 3)
    lease = await second.acquire(MODEL, priority=Priority.INTERACTIVE)
    await eventually(lambda: _true(stops.calls), "replica one to stop a line", 10)
    assert stops.calls == ["2"] and lease.worker.name == batch[2].worker.name  # the one that started last
    batch[2].release()  # (its request ends as it is stopped)
    standard = await second.acquire(MODEL)
    await eventually(lambda: _true(len(stops.calls) == 2), "replica one to stop another line", 10)
    assert stops.calls == ["2", "1"] and standard.worker.name == batch[1].worker.name
    for held in (batch[0], batch[1], lease, standard):
        held.release()
    assert "turnout_preempted_requests_total 2.0" in await _metrics(one)  # counted where the lines ran
    assert "turnout_preempted_requests_total 0.0" in await _metrics(two)


async def test_a_request_waiting_on_one_replica_stops_a_line_of_another_and_takes_its_slot(
    emulator: EmulatorFactory, gateway: GatewayFactory, tmp_path: Path, own_redis: str
) -> None:
    """Workers capped at one request each: both run a line of replica one; an interactive request on replica two
    waits in the queue (Redis's), stops the line that started last, and takes its slot once it is given back."""
    emus = [await emulator(name, [MODEL]) for name in "ab"]
    workers = [worker(e.name, e.url, max_concurrent=1) for e in emus]
    one, two = await _replicas(gateway, tmp_path, own_redis, workers, routing={"queue_timeout_s": 10})
    first, second = one.app[DISPATCHER], two.app[DISPATCHER]
    stops = Stops()
    older = await first.acquire(MODEL, priority=Priority.BATCH, stop=stops.to("older"))
    await asyncio.sleep(0.01)
    newer = await first.acquire(MODEL, priority=Priority.BATCH, stop=stops.to("newer"))
    await _offered(second, 2)
    waiting = asyncio.create_task(second.acquire(MODEL, priority=Priority.INTERACTIVE))
    await eventually(lambda: _true(stops.calls), "replica one to stop a line", 10)
    assert stops.calls == ["newer"] and not waiting.done()
    newer.release()  # its request ends: the slot goes to the waiter on the other replica
    lease = await asyncio.wait_for(waiting, 10)
    assert lease.worker.name == newer.worker.name and stops.calls == ["newer"]
    for held in (older, lease):
        held.release()


async def test_a_line_is_stopped_once_whichever_replicas_ask(
    emulator: EmulatorFactory, gateway: GatewayFactory, tmp_path: Path, own_redis: str
) -> None:
    """One one-slot engine running a line of replica one: interactive requests on both replicas at once stop it
    once (the stop is claimed in Redis), and with preempt_batch off nothing is offered or stopped."""
    emu = await emulator("a", [MODEL])
    one, two = await _replicas(gateway, tmp_path, own_redis, [worker("a", emu.url, slots=1)])
    first, second = one.app[DISPATCHER], two.app[DISPATCHER]
    stops = Stops()
    line = await first.acquire(MODEL, priority=Priority.BATCH, stop=stops.to("line"))
    await _offered(second, 1)
    await _offered(first, 0)  # (its own: its dispatcher's)
    people = await asyncio.gather(*(d.acquire(MODEL, priority=Priority.INTERACTIVE) for d in (first, second)))
    await eventually(lambda: _true(stops.calls), "the line to be stopped", 10)
    await asyncio.sleep(0.3)
    assert stops.calls == ["line"]
    for held in (line, *people):
        held.release()


async def test_a_batch_api_line_run_by_one_replica_is_stopped_for_a_request_to_another(
    emulator: EmulatorFactory, gateway: GatewayFactory, tmp_path: Path, own_redis: str
) -> None:
    """End to end: a batch of one line created on replica one (its runner runs it) on an engine that runs one
    request at a time, each answer 2 s long; a request sent to replica two while the line runs stops it and is
    answered first; the line is sent again and answered once."""
    emu = await emulator("a", [MODEL], tokens=20, token_delay_s=0.1, num_parallel=1)
    one, two = await _replicas(gateway, tmp_path, own_redis, [worker("a", emu.url, slots=1)], batches=FAST)
    first = one.app[DISPATCHER]
    async with openai.AsyncOpenAI(base_url=f"{one.url}/v1", api_key="-", max_retries=0) as oa:
        uploaded = await oa.files.create(file=("b.jsonl", io.BytesIO(jsonl([_line(1)]))), purpose="batch")
        batch = await oa.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        await eventually(lambda: _true(first._stoppable), "the line to run (stoppable)", 10)
        await _offered(two.app[DISPATCHER], 1)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "now"}]}
        async with aiohttp.ClientSession() as http, http.post(f"{two.url}/v1/chat/completions", json=body) as r:
            assert r.status == 200 and (await r.json())["choices"][0]["message"]["content"]
        # answered before the line (without the stop it would have waited for the line's 2 s in the engine)
        assert (await oa.batches.retrieve(batch.id)).request_counts.completed == 0  # type: ignore[union-attr]
        done = await finished(oa, batch.id, 60)
        assert done.status == "completed" and done.request_counts is not None
        assert done.request_counts.completed == 1 and done.request_counts.failed == 0
        output = await lines_of(oa, done.output_file_id)
        assert [o["custom_id"] for o in output] == ["l1"] and output[0]["response"]["status_code"] == 200
    assert "turnout_preempted_requests_total 1.0" in await _metrics(one)
    assert emu.served("/v1/chat/completions") == 3  # the line twice (stopped once), the request once


async def _true(value: Any) -> Any:
    return value or None
