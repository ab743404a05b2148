"""The fleet poller against emulators and a real metrics endpoint: health apart from inventory, probes that
spare busy workers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import EmulatorFactory, Gateway, GatewayFactory, eventually, free_port, serve_app, worker
from tests.support.ollama_emulator import Behaviour
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
    """Where the router has a choice of workers: the learned rates rank them (a model on one worker learns none)."""
    a = await emulator("a", ["m:1"], tokens=10, token_delay_s=0.001)
    b = await emulator("b", ["m:1"], tokens=10, token_delay_s=0.001)
    gw = await gateway([worker("a", a.url), worker("b", b.url)])
    async with aiohttp.ClientSession() as http:
        for stream in (False, True, False, True):
            async with http.post(f"{gw.url}/api/chat", json={"model": "m:1", "messages": [], "stream": stream}) as r:
                await r.read()
    learned = [state.learned["m:1"] for state in gw.app[FLEET].workers.values() if "m:1" in state.learned]
    assert learned and all(f.decode is not None and f.decode > 0 for f in learned)  # eval_count / eval_duration


async def _chat(url: str, model: str = "m:1") -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}/api/chat", json={"model": model, "messages": [], "stream": False}) as resp,
    ):
        body = await resp.json()
        return resp.status, body.get("message", {}).get("content", "") if resp.status == 200 else str(body)


async def _listing(gw: Gateway, name: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{gw.url}/admin/api/inventory", headers=gw.admin_headers) as resp,
    ):
        assert resp.status == 200
        return {w["name"]: w for w in (await resp.json())["workers"]}[name]


# For Ollama, /api/tags is inventory only (liveness is /api/version). For OpenAI-style workers /v1/models is
# the one probe: any HTTP answer proves the worker alive, so 5xx and bad JSON are inventory failures; a
# timeout there is no answer at all and counts as a failed probe, which is why busy ones are not probed.
BROKEN_LISTINGS = [
    pytest.param("ollama", {"tags_hang_s": 2}, "timed out", id="ollama-timeout"),
    pytest.param("ollama", {"tags_status": 500}, "HTTP 500", id="ollama-http-500"),
    pytest.param("ollama", {"tags_garbled": True}, "did not return JSON", id="ollama-bad-json"),
    pytest.param("openai", {"tags_status": 500}, "HTTP 500", id="openai-http-500"),
    pytest.param("openai", {"tags_status": 404}, "HTTP 404", id="openai-http-404"),
    pytest.param("openai", {"tags_garbled": True}, "did not return JSON", id="openai-bad-json"),
]


@pytest.mark.parametrize(("kind", "broken", "why"), BROKEN_LISTINGS)
async def test_failed_inventory_keeps_a_serving_worker_routable(
    emulator: EmulatorFactory, gateway: GatewayFactory, kind: str, broken: dict[str, Any], why: str
) -> None:
    emu = await emulator("a", ["m:1"])
    gw = await gateway(
        [worker("a", emu.url, type=kind)], health={"interval_s": 3600, "timeout_s": 0.5, "failures_to_down": 1}
    )
    state = gw.app[FLEET].workers["a"]
    assert state.healthy and state.inventory == frozenset({"m:1"}) and not state.inventory_stale
    for name, value in broken.items():
        setattr(emu.behaviour, name, value)
    emu.behaviour.models = ["m:1", "m:2"]  # what a working listing would now show
    for _ in range(3):  # however many rounds: still serving, so still healthy
        await gw.app[POLLER].poll_all()
    assert state.healthy and state.failures == 0
    assert state.inventory == frozenset({"m:1"}) and state.inventory_stale  # the last known, marked stale
    assert state.inventory_error is not None and why in state.inventory_error
    status, content = await _chat(gw.url)
    assert status == 200 and content.startswith("[a]")
    shown = await _listing(gw, "a")
    assert shown["healthy"] is True and shown["installed"] == ["m:1"]
    assert shown["inventory_stale"] is True and why in shown["inventory_error"] and shown["inventory_age_s"] >= 0
    for name in broken:
        setattr(emu.behaviour, name, Behaviour.__dataclass_fields__[name].default)
    await gw.app[POLLER].poll_all()
    assert state.healthy and state.inventory == frozenset({"m:1", "m:2"})
    assert not state.inventory_stale and state.inventory_error is None
    assert (await _listing(gw, "a"))["inventory_stale"] is False


async def test_inventory_never_fetched_stays_unknown_and_fails_open(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    emu = await emulator("a", ["m:1"], tags_status=500)
    gw = await gateway([worker("a", emu.url)])
    state = gw.app[FLEET].workers["a"]
    assert state.healthy and state.inventory is None and not state.inventory_stale  # unknown, not stale
    assert state.inventory_error is not None and "HTTP 500" in state.inventory_error
    status, content = await _chat(gw.url)  # unknown inventory fails open
    assert status == 200 and content.startswith("[a]")
    emu.behaviour.tags_status = None
    await gw.app[POLLER].poll_all()
    assert state.inventory == frozenset({"m:1"}) and state.inventory_error is None


async def test_failed_residency_keeps_the_last_known(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["m:1", "m:2"], loaded=["m:1"])
    gw = await gateway([worker("a", emu.url)])
    state = gw.app[FLEET].workers["a"]
    assert state.loaded == frozenset({"m:1"})
    emu.behaviour.ps_status = 500
    emu.behaviour.loaded = ["m:2"]
    await gw.app[POLLER].poll_all()
    assert state.healthy and state.loaded == frozenset({"m:1"}) and not state.inventory_stale
    emu.behaviour.ps_status = None
    await gw.app[POLLER].poll_all()
    assert state.loaded == frozenset({"m:2"})


async def test_ollama_liveness_is_api_version(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["m:1"])
    gw = await gateway([worker("a", emu.url)])
    assert emu.listings[0] == "/api/version" and "/api/tags" in emu.listings
    emu.behaviour.version_hang_s = 2  # liveness itself silent, nothing in progress: that counts
    await gw.app[POLLER].poll_all()
    state = gw.app[FLEET].workers["a"]
    assert state.healthy is False and state.last_error is not None and "timed out" in state.last_error


async def test_ollama_probe_timeout_while_requests_progress_does_not_count(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    emu = await emulator("a", ["m:1"], tokens=40, token_delay_s=0.03)
    gw = await gateway([worker("a", emu.url)], health={"interval_s": 3600, "timeout_s": 0.3, "failures_to_down": 1})
    state, poller = gw.app[FLEET].workers["a"], gw.app[POLLER]
    assert state.healthy
    emu.behaviour.version_hang_s = 5  # a machine too loaded to answer its listing in time
    lines = []
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/api/chat", json={"model": "m:1", "messages": []}) as resp,
    ):
        lines.append(await resp.content.readline())
        await poller.poll_all()  # /api/version times out while the stream flows
        assert state.healthy and state.failures == 0 and state.in_flight == 1
        async for line in resp.content:
            lines.append(line)
    assert len(lines) == 41 and json.loads(lines[-1])["done"] is True  # every token arrived
    assert emu.listings.count("/api/version") == 2  # Ollama's listings are probed while busy

    async def silent_worker_goes_down() -> bool:
        await poller.poll_all()  # once the stream is over and quiet for a window, a timeout counts
        return not state.healthy

    await eventually(silent_worker_goes_down, "a silent worker to be marked down", limit_s=10)


async def test_busy_openai_worker_is_not_probed(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["m:1"], tokens=30, token_delay_s=0.02)
    gw = await gateway(
        [worker("a", emu.url, type="openai")], health={"interval_s": 0.3, "timeout_s": 1, "failures_to_down": 1}
    )
    state, poller = gw.app[FLEET].workers["a"], gw.app[POLLER]
    probes = emu.listings.count("/v1/models")
    assert probes >= 1 and state.healthy
    body = {"model": "m:1", "messages": [], "stream": True}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/v1/chat/completions", json=body) as resp,
    ):
        events = [await resp.content.readline()]
        for _ in range(3):
            await poller.poll_all()
        assert state.in_flight == 1 and emu.listings.count("/v1/models") == probes  # nothing in flight disturbed
        async for line in resp.content:
            events.append(line)
    assert events[-2] == b"data: [DONE]\n" and state.healthy

    async def probed_when_idle() -> bool:
        await poller.poll_all()
        return emu.listings.count("/v1/models") > probes

    await eventually(probed_when_idle, "an idle worker to be probed again", limit_s=10)
