"""The fleet poller against emulators and a real metrics endpoint."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import EmulatorFactory, GatewayFactory, free_port, serve_app, worker
from turnout.gateway.keys import FLEET, POLLER

DCGM = """# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0"} 80
DCGM_FI_DEV_GPU_UTIL{gpu="1"} 40
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0"} 9000
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0"} 1000
"""


@pytest.fixture
async def metrics_url() -> AsyncIterator[str]:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=DCGM, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handler)
    url, runner = await serve_app(app)
    yield f"{url}/metrics"
    await runner.cleanup()


async def test_unreachable_worker_has_unknown_inventory_then_comes_up(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    port = free_port()
    gw = await gateway([worker("late", f"http://127.0.0.1:{port}")])
    state = gw.app[FLEET].workers["late"]
    assert state.healthy is False and state.inventory is None and state.last_error
    emu = await emulator("late", ["m:1"])
    await emu.stop()
    await emu.start(port)
    await gw.app[POLLER].poll_all()
    assert state.healthy is True and state.inventory == frozenset({"m:1"})
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/api/chat", json={"model": "m:1", "messages": [], "stream": False}) as resp,
    ):
        assert resp.status == 200


async def test_failures_to_down(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["m:1"])
    gw = await gateway([worker("a", emu.url)], health={"interval_s": 3600, "timeout_s": 1, "failures_to_down": 2})
    state = gw.app[FLEET].workers["a"]
    port = emu.port
    await emu.stop()
    await gw.app[POLLER].poll_all()
    assert state.healthy is True and state.failures == 1  # one miss is tolerated
    await gw.app[POLLER].poll_all()
    assert state.healthy is False
    await emu.start(port)
    await gw.app[POLLER].poll_all()
    assert state.healthy is True and state.failures == 0


async def test_gpu_and_vram_signals(emulator: EmulatorFactory, gateway: GatewayFactory, metrics_url: str) -> None:
    a = await emulator("a", ["m:1"], loaded=["m:1"], vram_fraction=0.5)
    b = await emulator("b", ["m:1"], loaded=["m:1"])
    gw = await gateway([worker("a", a.url), worker("b", b.url, metrics_url=metrics_url)])
    fleet = gw.app[FLEET]
    assert fleet.workers["a"].offload == pytest.approx(0.5) and fleet.workers["a"].gpu_util is None
    assert fleet.workers["b"].gpu_util == pytest.approx(0.6)
    assert fleet.workers["b"].vram_pressure == pytest.approx(0.9)
    assert fleet.workers["a"].vram_pressure == pytest.approx(0.5)
    # b: busy GPU and full VRAM; a: half offloaded, GPU unknown (neutral) -> a wins
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/api/chat", json={"model": "m:1", "messages": [], "stream": False}) as resp,
    ):
        assert (await resp.json())["message"]["content"].startswith("[a]")


async def test_learned_speed_is_recorded(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["m:1"], tokens=10, token_delay_s=0.001)
    gw = await gateway([worker("a", emu.url)])
    async with aiohttp.ClientSession() as http:
        for stream in (False, True):
            async with http.post(f"{gw.url}/api/chat", json={"model": "m:1", "messages": [], "stream": stream}) as r:
                await r.read()
    speed = gw.app[FLEET].workers["a"].speed["m:1"]
    assert speed > 0
