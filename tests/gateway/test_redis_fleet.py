"""Replicas share what they learn of the fleet through Redis (a real redis-server): learned speeds pooled, what an
engine ran at once, a model taken out; and one probe per worker at a time, the others taking what it found."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from tests.conftest import EmulatorFactory, GatewayFactory, worker
from tests.support.services import redis_server
from turnout.config import load_settings
from turnout.core.admission import Caps, Priority
from turnout.core.health import ModelHealth
from turnout.core.signals import Sample
from turnout.fleet.poller import Poller
from turnout.fleet.state import Fleet
from turnout.gateway.keys import DISPATCHER, METRICS, POLLER
from turnout.gateway.occupancy import Grant
from turnout.gateway.redis_fleet import FleetSync, SharedProbes
from turnout.gateway.redis_occupancy import RedisOccupancy
from turnout.state.placement_store import PlacementStore
from turnout.upstream.client import UpstreamClient


def fleet_of(tmp_path: Path, name: str, workers: list[dict[str, Any]]) -> Fleet:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"storage": {"data_dir": str(tmp_path / name)}, "workers": workers}))
    settings = load_settings(path, env={})
    store = PlacementStore(tmp_path / f"{name}-placement.json")
    store.load()
    return Fleet(settings, store)


def keeper(url: str, prefix: str, fleet: Fleet) -> RedisOccupancy:
    return RedisOccupancy(
        url,
        prefix=prefix,
        timeout_s=0.5,
        index=lambda w: fleet.workers[w].prefix if w in fleet.workers else None,
        tenant_caps={},
        max_blocks=1000,
        max_sessions=100,
        prefix_ttl_s=600,
    )


async def test_what_one_replica_learned_counts_on_another(redis_url: str, tmp_path: Path) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    workers = [worker("w", "http://127.0.0.1:9", type="openai")]
    a_fleet, b_fleet = fleet_of(tmp_path, "a", workers), fleet_of(tmp_path, "b", workers)
    a, b = keeper(redis_url, prefix, a_fleet), keeper(redis_url, prefix, b_fleet)
    await a.start()
    await b.start()
    try:
        now = time.monotonic()
        learned = a_fleet.workers["w"]
        for _ in range(5):  # five answers at 200 prompt tokens/s and 20 completion tokens/s
            learned.observe("m", Sample(prefill_tokens=400, prefill_s=2.0, decode_tokens=40, decode_s=2.0), now, 300)
        learned.figures("m").parallel.observe(3, now)
        learned.figures("m").parallel.observe(3, now)
        learned.models["m"] = ModelHealth(failures=5, out_until=now + 30, outs=1, reason="requests failing: HTTP 500")
        b_fleet.workers["w"].observe("m", Sample(prefill_tokens=400, prefill_s=1.0), now, 300)  # b: 400/s, once
        await FleetSync(a, a_fleet).sync()
        await FleetSync(b, b_fleet).sync()
        theirs = b_fleet.workers["w"].learned["m"]
        prefill, prefill_n, decode, decode_n, _ = theirs.pooled(time.monotonic(), 300)
        assert prefill_n == 6 and decode_n == 5 and decode is not None and abs(decode - 20) < 0.5
        assert prefill is not None and 200 < prefill < 240  # five answers at 200 and one at 400, by their times
        assert b_fleet.workers["w"].parallelism("m", time.monotonic()).slots == 3  # seen on a: counts on b
        assert b_fleet.workers["w"].model_out("m", time.monotonic()) == "requests failing: HTTP 500"
    finally:
        await a.close()
        await b.close()


async def test_one_replica_probes_a_worker_the_others_take_what_it_found(
    redis_url: str, emulator: EmulatorFactory, tmp_path: Path
) -> None:
    emu = await emulator("e", ["m:1"])
    prefix = f"t{uuid.uuid4().hex[:8]}"
    workers = [worker("e", emu.url, type="ollama")]
    fleets = [fleet_of(tmp_path, n, workers) for n in ("a", "b", "c")]
    keepers = [keeper(redis_url, prefix, f) for f in fleets]
    client = UpstreamClient(connect_timeout_s=2, total_timeout_s=5)
    await client.start()
    pollers = []
    try:
        for k, f in zip(keepers, fleets, strict=True):
            await k.start()
            poller = Poller(f, client)
            poller.probes = SharedProbes(k, interval_s=30)
            pollers.append(poller)
        for poller in pollers:
            await poller.poll_all()
        assert emu.listings.count("/api/version") == 1  # one probe of all three replicas
        for f in fleets:
            state = f.workers["e"]
            assert state.healthy and state.inventory == frozenset({"m:1"})
    finally:
        for k in keepers:
            await k.close()
        await client.close()


async def test_a_one_at_a_time_engine_busy_on_another_replica_is_not_probed(
    redis_url: str, emulator: EmulatorFactory, tmp_path: Path
) -> None:
    """An OpenAI-style server not known to answer beside its requests (it may cut a stream for a probe) is probed
    by no replica while any replica has a request in flight there."""
    emu = await emulator("e", ["m:1"])
    prefix = f"t{uuid.uuid4().hex[:8]}"
    workers = [worker("e", emu.url, type="openai")]
    busy_fleet, idle_fleet = fleet_of(tmp_path, "busy", workers), fleet_of(tmp_path, "idle", workers)
    busy, idle = keeper(redis_url, prefix, busy_fleet), keeper(redis_url, prefix, idle_fleet)
    client = UpstreamClient(connect_timeout_s=2, total_timeout_s=5)
    await client.start()
    try:
        await busy.start()
        await idle.start()
        lease = Grant("l1", "e", "m:1", "", Priority.STANDARD, Caps(), None)
        assert await busy.take(lease) is None  # a request in flight there, from the other replica
        poller = Poller(idle_fleet, client)
        poller.probes = SharedProbes(idle, interval_s=30)
        await poller.poll_all()
        assert emu.listings == []  # not probed
        busy.give(lease)
        await busy.close()  # (its give reaches Redis before it stops)
        await poller.poll_all()
        assert emu.listings == ["/v1/models"]
    finally:
        await idle.close()
        await client.close()


async def test_two_replicas_routing_at_the_same_moment_take_two_engines(
    emulator: EmulatorFactory, gateway: GatewayFactory, tmp_path: Path
) -> None:
    """Two replicas route a request each at the same moment, on the same counts (two idle one-slot engines, ties
    broken alike): both choose the same engine, the second's take finds it busy and routes again, on the new counts,
    to the other. Before, both were sent to one engine while the other stood idle (one process routes one request
    after the other's take, so only replicas met this: the load guard fired 7 times behind three replicas where one
    replica fired it 43 times, bench/prefix.py --replicas 3)."""
    engines = [await emulator(name, ["m:1"]) for name in ("e1", "e2")]
    workers = [worker(e.name, e.url, slots=1) for e in engines]
    with redis_server() as url:  # its own: nothing of another test's in it
        replicas = [
            await gateway(workers, storage={"data_dir": str(tmp_path / name), "redis_url": url}) for name in "ab"
        ]
        for gw in replicas:
            await gw.app[POLLER].poll_all()
        a, b = (gw.app[DISPATCHER] for gw in replicas)
        leases = await asyncio.gather(a.acquire("m:1"), b.acquire("m:1"))
        try:
            assert sorted(lease.worker.name for lease in leases) == ["e1", "e2"]
            moved = sum(gw.app[METRICS].routing.labels("moved")._value.get() for gw in replicas)
            assert moved == 1
        finally:
            for lease in leases:
                lease.release()
            for gw in replicas:
                await gw.stop()  # before their Redis
