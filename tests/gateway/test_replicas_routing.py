"""Three replicas route as one (issue 33): real `turnout serve` processes, each with its own data dir, on one
PostgreSQL and one Redis, behind nginx round robin (tests/support/replicas.py). A worker's cap holds across them,
the next turn of a conversation goes where the last one went whichever replica it reaches, and a replica killed
mid-request gives its slot back within a lease's time."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from tests.conftest import EmulatorFactory, FleetFactory

MODEL = "m:1"
SYSTEM = "You are the assistant of this test. " + "Rule: answer in the voice of the test. " * 40


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, str]:
    async with http.post(f"{url}/v1/chat/completions", json=body) as r:
        await r.read()
        return r.status, r.headers.get("X-Turnout-Route", "")


async def test_a_cap_holds_across_replicas(emulator: EmulatorFactory, replica_fleet: FleetFactory) -> None:
    """A worker with max_concurrent 2 behind three replicas never holds three requests, and serves them all."""
    emu = await emulator("a", [MODEL], tokens=4, token_delay_s=0.02)
    fleet = await replica_fleet(
        {"workers": [{"name": "a", "url": emu.url, "type": "openai", "max_concurrent": 2}], "auth": {"open": True}},
        replicas=3,
        healthy_workers=1,
    )
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        results = await asyncio.gather(*(post(http, fleet.url, body) for _ in range(120)))
    assert [status for status, _ in results] == [200] * 120
    assert emu.peak_active == 2  # work-conserving: two at a time, never three
    assert len(set(fleet.balancer.served_by())) == 3 if fleet.balancer else True  # every replica took some


async def test_the_next_turn_follows_the_prefix_on_any_replica(
    emulator: EmulatorFactory, replica_fleet: FleetFactory
) -> None:
    """Each turn of a conversation sent the moment the last one's answer ended (an agent's loop), each to another
    replica: it goes to the worker that holds its prefix (whose slot the last replica gave back before its answer's
    end went out, streamed or not)."""
    workers = []
    for name in ("a", "b", "c"):
        emu = await emulator(name, [MODEL])
        workers.append({"name": name, "url": emu.url, "type": "openai"})
    fleet = await replica_fleet(
        {"workers": workers, "auth": {"open": True}, "routing": {"explain_header": True}},
        replicas=3,
        healthy_workers=3,
    )
    async with aiohttp.ClientSession() as http:
        for conversation in range(3):
            messages = [
                {"role": "system", "content": SYSTEM + f" conversation {conversation}"},
                {"role": "user", "content": "first question " * 5},
            ]
            _, first = await post(http, fleet.replicas[0].url, {"model": MODEL, "messages": messages})
            messages += [{"role": "assistant", "content": "an answer"}, {"role": "user", "content": "again"}]
            for i, replica in enumerate(fleet.replicas[1:]):  # the next turns reach the other replicas, at once
                body = {"model": MODEL, "messages": messages, "stream": bool(i % 2)}
                status, route = await post(http, replica.url, body)
                assert status == 200
                worker, _, why = route.partition("; ")
                assert worker == first.partition("; ")[0] and why.startswith("prefix"), (first, route)


async def test_a_killed_replicas_slot_comes_back(emulator: EmulatorFactory, replica_fleet: FleetFactory) -> None:
    """One slot, a long answer on replica r0, r0 SIGKILLed: r1's request is served once r0's lease has expired (10 s
    after its last renewal), not never."""
    emu = await emulator("a", [MODEL], tokens=200, token_delay_s=0.1)
    fleet = await replica_fleet(
        {
            "workers": [{"name": "a", "url": emu.url, "type": "openai", "max_concurrent": 1}],
            "auth": {"open": True},
            "routing": {"queue_timeout_s": 60},
        },
        replicas=2,
        healthy_workers=1,
        balancer=False,
    )
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with aiohttp.ClientSession() as http:
        long = asyncio.ensure_future(post(http, fleet.replicas[0].url, body))
        for _ in range(100):
            if emu.active:
                break
            await asyncio.sleep(0.05)
        assert emu.active == 1
        fleet.kill(0)
        started = time.monotonic()
        async with http.post(f"{fleet.replicas[1].url}/v1/chat/completions", json=body) as r:
            status = r.status
            await r.content.readline()  # its first event: it got the slot (its whole answer takes 20 s more)
            waited = time.monotonic() - started
        long.cancel()
    assert status == 200
    assert waited < 25, waited  # the lease (10 s) and a renewal period, not the long answer's 20 s
