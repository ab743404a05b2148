"""One failing model must not take its worker's other models down, nor ever read as "not installed".

A worker (the Ollama emulator, real sockets) serves healthy models beside models that fail in each way a model
can: HTTP 500 (Ollama's answer when a runner crashes), an answer that is not JSON, a stream that breaks after it
started. Twelve requests at a time go through the gateway, on both dialects, streamed and not. The failing models
are taken out on that worker only; the healthy ones keep being served; the failing ones are answered 503
``no_healthy_worker`` naming the worker and why, with Retry-After, and never 404 ``model_not_installed``. A
connection that breaks before any answer is the worker's failure and takes the whole worker out.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import pytest

from tests.conftest import EmulatorFactory, Gateway, GatewayFactory, worker
from turnout.gateway.keys import FLEET

GOOD = ["good:latest", "also-good:latest"]
FAULTS = {"crashing:latest": "http_500", "garbled:latest": "invalid_json", "breaking:latest": "broken_stream"}
REASONS = {"http_500": "HTTP 500", "invalid_json": "invalid answer", "broken_stream": "streams breaking"}


async def _ask(http: aiohttp.ClientSession, gw: Gateway, model: str, n: int) -> tuple[int, dict[str, Any], str]:
    """One request in one of four shapes (dialect x stream): (status, error object or {}, Retry-After)."""
    ollama, stream = n % 2 == 0, n % 4 < 2
    path = "/api/chat" if ollama else "/v1/chat/completions"
    body = {"model": model.removesuffix(":latest"), "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    async with http.post(f"{gw.url}{path}", json=body) as resp:
        text = await resp.text()
        error: dict[str, Any] = {}
        if resp.status >= 400:
            data = await resp.json(content_type=None)
            error = data["error"] if isinstance(data["error"], dict) else {"message": data["error"], "code": None}
        elif stream:
            lines = [line for line in text.splitlines() if line.strip() and line.strip() != "data: [DONE]"]
            if not lines or '"error"' in lines[-1]:  # a started stream that ended in an error frame
                error = {"message": "stream error frame", "code": "stream"}
        return resp.status, error, resp.headers.get("Retry-After", "")


async def test_a_failing_model_is_taken_out_on_its_worker_and_the_others_keep_serving(
    emulator: EmulatorFactory, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnout")
    faulty = await emulator("w1", [*GOOD, *FAULTS], model_faults=dict(FAULTS))
    other = await emulator("w2", ["unrelated:latest"])  # healthy, and holds none of w1's models
    gw = await gateway(
        [worker("w1", faulty.url), worker("w2", other.url)],
        health={"interval_s": 3600, "timeout_s": 2, "request_failures_to_down": 5, "model_retry_s": 3600},
    )
    seen: dict[str, list[tuple[int, str]]] = {m: [] for m in [*GOOD, *FAULTS]}
    async with aiohttp.ClientSession() as http:
        for round_ in range(6):
            models = [*GOOD, *FAULTS] * 3
            answers = await asyncio.gather(*(_ask(http, gw, m, round_ * 12 + i) for i, m in enumerate(models[:12])))
            for model, (status, error, retry_after) in zip(models[:12], answers, strict=True):
                seen[model].append((status, error.get("code") or ""))
                assert status != 404 and error.get("code") != "model_not_installed", (model, status, error)
                if status == 503:
                    assert retry_after, (model, error)
        for model in GOOD:  # never failed, through every round
            assert all(status == 200 and not code for status, code in seen[model]), (model, seen[model])
        state = gw.app[FLEET].workers["w1"]
        assert state.healthy, "the worker was taken out for its models' failures"
        for model, fault in FAULTS.items():
            codes = [code for _, code in seen[model]]
            assert "no_healthy_worker" in codes, (model, seen[model])
            status, error, retry_after = await _ask(http, gw, model, 1)
            assert (status, error["code"]) == (503, "no_healthy_worker")
            bare = model.removesuffix(":latest")
            assert error["message"] == (
                f'model "{bare}" is installed only on w1, which is down (requests failing: {REASONS[fault]})'
            )
            assert int(retry_after) >= 1
        # The admin inventory and the worker's card say which models are out, and why
        async with http.get(f"{gw.url}/admin/api/inventory", headers=gw.admin_headers) as resp:
            card = next(w for w in (await resp.json())["workers"] if w["name"] == "w1")
        assert card["healthy"] is True
        assert set(card["models_out"]) == set(FAULTS)
        assert card["models_out"]["crashing:latest"] == "requests failing: HTTP 500"
    lines = [r.getMessage() for r in caplog.records if r.name == "turnout.fleet"]
    assert not any('worker "w1" is down' in line for line in lines), lines
    out = [line for line in lines if 'worker "w1": model "' in line and " is out (" in line]
    assert sorted(line.split('"')[3] for line in out) == sorted(FAULTS), out  # one line per model, once


async def test_a_model_out_comes_back_after_its_retry_time_once_it_answers(
    emulator: EmulatorFactory, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnout")
    emu = await emulator("w1", ["m:latest", "other:latest"], model_faults={"m:latest": "http_500"})
    gw = await gateway(
        [worker("w1", emu.url)], health={"interval_s": 3600, "request_failures_to_down": 2, "model_retry_s": 0.3}
    )
    async with aiohttp.ClientSession() as http:
        assert [(await _ask(http, gw, "m", 1))[0] for _ in range(2)] == [502, 502]
        status, error, _ = await _ask(http, gw, "m", 1)
        # the only worker: nothing healthy is left for this model, and the message says it is this model
        assert (status, error["code"]) == (503, "no_healthy_worker")
        assert error["message"] == 'no healthy worker for "m": w1 down for this model (requests failing: HTTP 500)'
        assert (await _ask(http, gw, "other", 1))[0] == 200
        served = emu.served()
        emu.behaviour.model_faults.clear()  # the operator fixed it
        await asyncio.sleep(0.4)
        assert (await _ask(http, gw, "m", 1))[0] == 200
        assert emu.served() == served + 1
    assert any('worker "w1": model "m:latest" is back' in r.getMessage() for r in caplog.records)


async def test_a_model_failing_again_after_its_retry_is_out_at_once_for_longer(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    emu = await emulator("w1", ["m:latest"], model_faults={"m:latest": "invalid_json"})
    gw = await gateway(
        [worker("w1", emu.url)], health={"interval_s": 3600, "request_failures_to_down": 3, "model_retry_s": 0.3}
    )
    async with aiohttp.ClientSession() as http:
        assert [(await _ask(http, gw, "m", 1))[0] for _ in range(3)] == [502, 502, 502]
        assert (await _ask(http, gw, "m", 1))[0] == 503
        await asyncio.sleep(0.35)
        assert (await _ask(http, gw, "m", 1))[0] == 502  # tried again: one failure takes it out again
        assert (await _ask(http, gw, "m", 1))[0] == 503
        await asyncio.sleep(0.35)
        assert (await _ask(http, gw, "m", 1))[0] == 503, "the second time out is twice as long"


async def test_a_connection_that_breaks_before_any_answer_takes_the_worker_out(
    emulator: EmulatorFactory, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnout")
    emu = await emulator("w1", ["m:latest", "n:latest"], model_faults={"m:latest": "reset"})
    gw = await gateway(
        [worker("w1", emu.url)],
        health={"interval_s": 3600, "request_failures_to_down": 2},
        routing={"hold_s": 0},  # the 503 at once, not after a hold for the worker to come back
    )
    async with aiohttp.ClientSession() as http:
        assert [(await _ask(http, gw, "m", 1))[0] for _ in range(2)] == [502, 502]
        assert not gw.app[FLEET].workers["w1"].healthy
        status, error, retry_after = await _ask(http, gw, "n", 1)  # the worker is out, for every model
        assert (status, error["code"]) == (503, "no_healthy_worker") and retry_after
        assert "w1 down (requests failing: connection broke before an answer)" in error["message"]
    assert any('worker "w1" is down: requests failing' in r.getMessage() for r in caplog.records)


async def test_a_model_out_on_an_endpoint_falls_back(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    """An endpoint's fallback model takes over when its model is out, as for any 5xx."""
    mac = await emulator("mac", ["llama3.2:latest"], model_faults={"llama3.2:latest": "http_500"})
    local = await emulator("local", ["backup:latest"])
    gw = await gateway(
        [worker("local", local.url)],
        env={"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true"},
        health={"interval_s": 3600, "request_failures_to_down": 2},
    )
    async with aiohttp.ClientSession() as http:
        registered = {"name": "mac", "url": mac.url, "api": "ollama", "fallback_model": "backup"}
        async with http.post(f"{gw.url}/admin/api/endpoints", json=registered, headers=gw.admin_headers) as resp:
            assert resp.status == 201, await resp.text()
        for _ in range(4):
            body = {"model": "mac/llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": False}
            async with http.post(f"{gw.url}/v1/chat/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                assert resp.headers["X-Fallback-From"] == "mac/llama3.2"
    assert local.served() == 4
    assert mac.served() == 2, "the model out on the endpoint still got requests"


@pytest.mark.parametrize("check", ["background", "admin test"])
async def test_a_model_out_on_an_endpoint_is_back_as_soon_as_a_health_check_sees_it_online(
    emulator: EmulatorFactory, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture, check: str
) -> None:
    """The endpoints design: "The next request tries the Mac first again as soon as a health check sees it online"
    (docs/endpoints.md, Fallback). Its model, out for an hour after failed requests, is back at the next check
    that finds the endpoint online, whichever check it is (the periodic one or ``POST .../test``), not after the
    hour."""
    caplog.set_level(logging.INFO, logger="turnout")
    # While it fails, the Mac answers its list route with a 500 too (an Ollama in trouble): the periodic checks
    # see it degraded, not online, so the model stays out until the Mac is fixed.
    mac = await emulator("mac", ["llama3.2:latest"], model_faults={"llama3.2:latest": "http_500"}, tags_status=500)
    local = await emulator("local", ["backup:latest"])
    interval = "0.2" if check == "background" else "0"
    gw = await gateway(
        [worker("local", local.url)],
        env={"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true", "APP_MODEL_ENDPOINT_HEALTH_INTERVAL": interval},
        health={"interval_s": 3600, "request_failures_to_down": 2, "model_retry_s": 3600},
    )
    body = {"model": "mac/llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    async with aiohttp.ClientSession() as http:
        registered = {"name": "mac", "url": mac.url, "api": "ollama", "fallback_model": "backup"}
        async with http.post(f"{gw.url}/admin/api/endpoints", json=registered, headers=gw.admin_headers) as resp:
            assert resp.status == 201, await resp.text()
        for _ in range(3):  # two 500s take the model out; the third goes straight to the fallback
            async with http.post(f"{gw.url}/v1/chat/completions", json=body) as resp:
                assert resp.status == 200 and resp.headers["X-Fallback-From"] == "mac/llama3.2"
        state = gw.app[FLEET].workers["mac"]
        assert state.model_out("mac/llama3.2", asyncio.get_running_loop().time()) == "requests failing: HTTP 500"
        assert mac.served() == 2
        mac.behaviour.model_faults.clear()  # the Mac is fixed; the model would stay out for an hour
        mac.behaviour.tags_status = None
        if check == "admin test":
            async with http.post(f"{gw.url}/admin/api/endpoints/mac/test", headers=gw.admin_headers) as resp:
                assert resp.status == 200 and (await resp.json())["test"]["ok"] is True
        else:
            deadline = asyncio.get_running_loop().time() + 10
            while state.models_out(asyncio.get_running_loop().time()):
                assert asyncio.get_running_loop().time() < deadline, "no health check brought the model back"
                await asyncio.sleep(0.05)
        async with http.post(f"{gw.url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            assert "X-Fallback-From" not in resp.headers, "the request went to the fallback, not the Mac"
        assert mac.served() == 3 and local.served() == 3
    back = [r.getMessage() for r in caplog.records if " is back " in r.getMessage()]
    assert len(back) == 1 and back[0].startswith('endpoint "mac": model "mac/llama3.2'), back
    assert back[0].endswith(" is back (a health check found the endpoint online)"), back
