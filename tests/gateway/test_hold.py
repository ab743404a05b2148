"""Hold, don't bounce: a request whose workers are down for a moment (a restart) waits for them in the queue, up to
routing.hold_s, instead of a 503 at once; one for a model no worker can serve soon is answered at once; a hold that
runs out is one 503 with Retry-After and its place given back. (Claimed models asleep or activating:
tests/runtime/test_demo.py and test_gateway_claims.py.)"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from tests.conftest import EmulatorFactory, GatewayFactory, eventually, worker
from tests.gateway.test_server_timing import server_timing
from turnout.core.admission import Priority
from turnout.gateway.keys import DISPATCHER, FLEET, METRICS, POLLER
from turnout.gateway.timing import Phases

BODY = {"model": "m:1", "messages": [{"role": "user", "content": "hi"}], "stream": False}


async def test_a_restarting_worker_is_waited_for(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["m:1"])
    gw = await gateway([worker("a", emu.url)], routing={"hold_s": 30}, health={"interval_s": 0.2, "timeout_s": 1})
    state = gw.app[FLEET].workers["a"]
    assert state.healthy
    port = emu.port
    await emu.stop()  # the box restarts

    async def down() -> bool:
        return not state.healthy

    await eventually(down, "the worker seen down", limit_s=10)
    async with aiohttp.ClientSession() as http:
        asked = asyncio.ensure_future(http.post(f"{gw.url}/api/chat", json=BODY))
        await asyncio.sleep(0.5)
        assert not asked.done()  # held, not answered 503
        assert gw.app[DISPATCHER].waiting == 1
        assert gw.app[METRICS].requests_held == 1  # turnout_held_requests
        await emu.start(port)  # back
        async with await asked as r:
            assert r.status == 200, await r.text()
            timing = server_timing(r.headers["Server-Timing"])
    assert gw.app[DISPATCHER].waiting == 0
    assert gw.app[METRICS].requests_held == 0
    # the wait for the worker is the hold (at least the half second before it came back), not the queue's
    assert list(timing) == ["queue", "hold", "upstream", "ttft", "total"], timing
    assert timing["hold"] >= 500 and timing["queue"] < timing["hold"], timing


async def test_requests_behind_a_held_one_are_held_alike(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    """Three requests while the only worker restarts: the first is held, and those queued behind it are held too,
    up to hold_s and not the queue's shorter timeout, each in the hold phase (they were waits of the queue, answered
    503 saturated after queue_timeout_s)."""
    emu = await emulator("a", ["m:1"])
    gw = await gateway(
        [worker("a", emu.url)],
        routing={"hold_s": 30, "queue_timeout_s": 0.5},
        health={"interval_s": 0.2, "timeout_s": 1},
    )
    state = gw.app[FLEET].workers["a"]
    port = emu.port
    await emu.stop()

    async def down() -> bool:
        return not state.healthy

    await eventually(down, "the worker seen down", limit_s=10)
    async with aiohttp.ClientSession() as http:
        asked = [asyncio.ensure_future(http.post(f"{gw.url}/api/chat", json=BODY)) for _ in range(3)]

        async def all_held() -> bool:
            return gw.app[METRICS].requests_held == 3

        await eventually(all_held, "three requests held", limit_s=10)
        await asyncio.sleep(1.0)  # past the queue's timeout
        assert not any(a.done() for a in asked)
        await emu.start(port)
        for a in asked:
            async with await a as r:
                assert r.status == 200, await r.text()
                assert server_timing(r.headers["Server-Timing"])["hold"] >= 1000
    assert gw.app[METRICS].requests_held == 0 and gw.app[DISPATCHER].waiting == 0


async def test_a_worker_never_seen_healthy_is_not_waited_for(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    emu = await emulator("a", ["m:1"])
    url = emu.url
    await emu.stop()  # down before the gateway ever saw it
    gw = await gateway([worker("a", url)], routing={"hold_s": 30})
    started = time.monotonic()
    async with aiohttp.ClientSession() as http, http.post(f"{gw.url}/api/chat", json=BODY) as r:
        assert r.status == 503 and (await r.json())["error"] and r.headers["Retry-After"]
    assert time.monotonic() - started < 5


async def test_a_hold_that_runs_out_is_one_503_and_gives_its_place_back(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    emu = await emulator("a", ["m:1"])
    gw = await gateway([worker("a", emu.url)], routing={"hold_s": 1}, health={"interval_s": 3600})
    await emu.stop()
    await gw.app[POLLER].poll_all()  # seen down, healthy a moment ago
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/api/chat", json=BODY) as r:
            assert r.status == 503 and r.headers["Retry-After"]
            assert (await r.json())["error"]  # Ollama's dialect
        held_s = time.monotonic() - started
        assert 0.9 <= held_s < 10, held_s
        assert gw.app[DISPATCHER].waiting == 0
        # a client that asks not to be held is answered at once
        started = time.monotonic()
        async with http.post(f"{gw.url}/api/chat", json=BODY, headers={"X-Turnout-Hold": "0"}) as r:
            assert r.status == 503
        assert time.monotonic() - started < 0.9


async def test_held_requests_keep_their_fair_place(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    """Held requests wait in the queue: counted against routing.max_queue, and a full queue refuses at once."""
    emu = await emulator("a", ["m:1"])
    gw = await gateway([worker("a", emu.url)], routing={"max_queue": 1})
    dispatcher = gw.app[DISPATCHER]
    ready = asyncio.Event()
    held = asyncio.ensure_future(dispatcher.hold("m:1", "", Priority.STANDARD, ready.is_set, 30))
    await asyncio.sleep(0.1)
    assert dispatcher.waiting == 1
    try:
        await dispatcher.hold("m:1", "", Priority.STANDARD, ready.is_set, 30)
        raise AssertionError("a second hold found room in a queue of one")
    except Exception as exc:
        assert getattr(exc, "code", None) == "saturated", exc
    ready.set()
    dispatcher.wake_all()
    ticket = await held
    assert ticket is not None
    lease = await dispatcher.acquire("m:1", ticket=ticket)
    lease.release()
    assert dispatcher.waiting == 0


async def test_a_hold_is_the_requests_hold_phase_and_counts_as_held(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """The wait inside Dispatcher.hold is the request's ``hold`` phase, once per hold, and counts in
    turnout_held_requests while it lasts, however it ends (ready, or out of time)."""
    emu = await emulator("a", ["m:1"])
    gw = await gateway([worker("a", emu.url)])
    dispatcher, metrics = gw.app[DISPATCHER], gw.app[METRICS]
    phases = Phases(time.perf_counter())
    ready = asyncio.Event()
    held = asyncio.ensure_future(dispatcher.hold("m:1", "", Priority.STANDARD, ready.is_set, 30, phases))

    async def counted() -> bool:
        return metrics.requests_held == 1

    await eventually(counted, "the hold counted as held")
    assert "turnout_held_requests 1.0" in metrics.render().decode()
    assert phases.holds is None  # (recorded when it ends)
    before = time.perf_counter()
    ready.set()
    dispatcher.wake_all()
    ticket = await held
    assert ticket is not None and metrics.requests_held == 0
    assert phases.holds is not None and len(phases.holds) == 1
    start, end = phases.holds[0]
    assert start < before <= end  # it spans the wait, up to the model's being ready
    lease = await dispatcher.acquire("m:1", ticket=ticket, phases=phases)
    lease.release()
    assert len(phases.holds) == 1  # (a slot free at once: acquire held nothing more)
    # a hold that runs out is a hold too
    assert await dispatcher.hold("m:1", "", Priority.STANDARD, lambda: False, 0.2, phases) is None
    assert len(phases.holds) == 2 and metrics.requests_held == 0 and dispatcher.waiting == 0
