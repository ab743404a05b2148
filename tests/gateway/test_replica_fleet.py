"""The replica harness itself (tests/support/replicas.py): three real `turnout serve` processes with their own data
dirs on one PostgreSQL and one Redis, behind the shipped nginx config; a SIGKILLed replica is skipped by nginx and
comes back; Redis stops and starts on its port; every process is stopped at the end (the suite's leak checks)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.conftest import EmulatorFactory, FleetFactory, eventually


def fleet_config(url: str) -> dict[str, Any]:
    return {
        "workers": [{"name": "a", "url": url, "type": "ollama"}],
        "auth": {"open": True},
        # short: a replica that starts while another holds the probe lease learns the health at its next round
        "health": {"interval_s": 2, "timeout_s": 2},
    }


async def chat(http: aiohttp.ClientSession, url: str) -> int:
    body = {"model": "qwen3:8b", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    async with http.post(f"{url}/api/chat", json=body) as r:
        await r.read()
        return r.status


async def test_three_replicas_behind_nginx_round_robin_and_a_killed_one_is_skipped(
    emulator: EmulatorFactory, replica_fleet: FleetFactory
) -> None:
    emu = await emulator("a", ["qwen3:8b"])
    fleet = await replica_fleet(fleet_config(emu.url), replicas=3, healthy_workers=1)
    assert fleet.balancer is not None and fleet.redis is not None
    assert len({r.data_dir for r in fleet.replicas}) == 3
    async with aiohttp.ClientSession() as http:
        pids = set()
        for url in fleet.urls:
            async with http.get(f"{url}/healthz") as r:
                pids.add((await r.json())["pid"])
        assert len(pids) == 3
        assert [await chat(http, fleet.url) for _ in range(6)] == [200] * 6
        ports = {f"127.0.0.1:{r.port}" for r in fleet.replicas}
        assert set(fleet.balancer.served_by()) == ports  # round robin reached every replica

        fleet.kill(1)
        assert not fleet.replicas[1].alive
        statuses = [await chat(http, fleet.url) for _ in range(9)]
        assert statuses == [200] * 9, statuses  # nginx skips the dead one (connection refused: next upstream)
        assert emu.served("/api/chat") == 15

        await fleet.astart_replica(1)
        assert "r1" in fleet.logs() and fleet.replicas[1].log().count("turnout") >= 1
        assert await chat(http, fleet.replicas[1].url) == 200


async def test_redis_stops_and_starts_again_on_its_port_and_serve_args_reach_the_replicas(
    emulator: EmulatorFactory, replica_fleet: FleetFactory
) -> None:
    emu = await emulator("a", ["qwen3:8b"])
    fleet = await replica_fleet(
        fleet_config(emu.url), replicas=2, balancer=False, healthy_workers=1, serve_args=["--workers", "2"]
    )
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:  # new connections

        async def two_processes() -> bool:  # serve_args reached `turnout serve`: two processes share the port
            pids = set()
            for _ in range(20):
                async with http.get(f"{fleet.urls[0]}/healthz") as r:
                    pids.add((await r.json())["pid"])
            return len(pids) == 2

        await eventually(two_processes, "both processes of replica r0 to answer", limit_s=30)
    redis = fleet.redis
    assert redis is not None
    url = redis.url
    await asyncio.to_thread(redis.stop)
    assert not redis.running
    async with aiohttp.ClientSession() as http:
        assert await chat(http, fleet.urls[0]) == 200  # open access: no limits to count, nothing needs Redis
    await asyncio.to_thread(redis.start)
    assert redis.running and redis.url == url

    async def said_once_each_way() -> bool:
        log = fleet.replicas[0].log()
        return "Redis (" in log and "Redis answers again" in log

    await eventually(said_once_each_way, "the replica's log to say Redis went and came back", limit_s=30)
