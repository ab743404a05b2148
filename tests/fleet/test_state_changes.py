"""Every change of a worker's or an endpoint's state is logged once, with its reason, and a 503 for a model
whose workers are all down names each one's reason (from the health snapshot the router sees).

Real sockets throughout: Ollama emulators that stop, hang and come back, and the gateway's own poller,
endpoint checks and proxy."""

from __future__ import annotations

import logging
import re
from typing import Any

import aiohttp
import pytest

from tests.conftest import ADMIN_TOKEN, EmulatorFactory, Gateway, GatewayFactory, worker
from turnout.gateway.keys import ENDPOINTS, POLLER

PRIVATE_OK = {"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true"}


def changes(caplog: pytest.LogCaptureFixture, name: str, *, detail: bool = False) -> list[str]:
    """The state-change lines about one worker or endpoint, in order; without the error's own text
    (`` [a: cannot connect to ...]``) unless ``detail``."""
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name in ("turnout.fleet", "turnout.endpoints") and f'"{name}" is ' in r.getMessage()
    ]
    return lines if detail else [re.sub(r" \[[^\]]*\]", "", line) for line in lines]


async def chat(gw: Gateway, model: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/v1/chat/completions", json={"model": model, "messages": []}) as resp,
    ):
        return resp.status, await resp.json()


async def test_worker_changes_are_logged_once_each_with_their_reason(
    emulator: EmulatorFactory, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnout")
    emu = await emulator("a", ["llama3:latest"])
    gw = await gateway(
        [worker("a", emu.url)], health={"interval_s": 3600, "timeout_s": 0.3}, routing={"hold_s": 0}
    )  # hold_s 0: the 503 at once, not after a hold for the worker to come back
    poller = gw.app[POLLER]
    assert changes(caplog, "a") == ['worker "a" is up']
    port = emu.port
    await emu.stop()
    for _ in range(3):  # three polls, one change
        await poller.poll_all()
    assert changes(caplog, "a")[1:] == ['worker "a" is down: connection refused']
    assert f"[a: cannot connect to 127.0.0.1:{port}: " in changes(caplog, "a", detail=True)[1]  # the error itself
    assert caplog.records[-1].levelno == logging.WARNING
    status, body = await chat(gw, "llama3")
    assert status == 503 and body["error"]["code"] == "no_healthy_worker"
    assert body["error"]["message"] == 'no healthy worker for "llama3": a down (connection refused)'
    emu.behaviour.version_hang_s = 2  # back, but too loaded to answer its liveness probe in time
    await emu.start(port)
    await poller.poll_all()
    await poller.poll_all()
    assert changes(caplog, "a")[2:] == ['worker "a" is still down, now: timeout']
    assert (await chat(gw, "llama3"))[1]["error"]["message"] == 'no healthy worker for "llama3": a down (timeout)'
    emu.behaviour.version_hang_s = 0
    await poller.poll_all()
    await poller.poll_all()
    assert changes(caplog, "a")[3:] == ['worker "a" is up again (was down: timeout)']
    assert (await chat(gw, "llama3"))[0] == 200


async def test_a_worker_that_refuses_a_request_is_down_once_and_the_503_says_why(
    emulator: EmulatorFactory, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnout")
    a, b = await emulator("a", ["llama3:latest"]), await emulator("b", ["llama3:latest"])
    gw = await gateway([worker("a", a.url), worker("b", b.url)], routing={"hold_s": 0})  # the 503 at once
    await a.stop()
    await b.stop()
    status, body = await chat(gw, "llama3")  # both tried, both refuse: the last failure is the answer
    assert status == 502 and body["error"]["code"] == "connect_refused"
    status, body = await chat(gw, "llama3")
    assert status == 503
    assert body["error"]["message"] == (
        'no healthy worker for "llama3": a down (connection refused), b down (connection refused)'
    )
    for name in ("a", "b"):
        assert changes(caplog, name)[1:] == [f'worker "{name}" is down: connection refused']


async def test_endpoint_changes_are_logged_once_each_with_their_reason(
    emulator: EmulatorFactory, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnout")
    mac = await emulator("mac", ["llama3.2:latest"])
    gw = await gateway([], env=PRIVATE_OK, health={"interval_s": 3600, "timeout_s": 0.3})
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
        body = {"name": "mac", "url": mac.url, "api": "ollama"}
        async with http.post(f"{gw.url}/admin/api/endpoints", json=body) as resp:
            assert resp.status == 201
    manager = gw.app[ENDPOINTS]
    mac.behaviour.tags_hang_s = 2  # the laptop went to sleep
    for _ in range(2):
        await manager.check("mac")
    status, answer = await chat(gw, "mac/llama3.2")
    assert status == 503 and answer["error"]["message"] == (
        'no healthy worker for "mac/llama3.2": mac down (asleep: timeout)'
    )
    mac.behaviour.tags_hang_s = 0
    await manager.check("mac")
    mac.behaviour.require_key = "new-key"  # someone set a key on the server: ours is wrong now
    await manager.check("mac")
    await manager.check("mac")
    mac.behaviour.require_key = None
    port = mac.port
    await mac.stop()
    await manager.check("mac")
    await manager.check("mac")
    await mac.start(port)
    await manager.check("mac")
    lines = changes(caplog, "mac")
    assert lines[0] == 'endpoint "mac" is online'
    assert lines[1] == (
        'endpoint "mac" is asleep: timeout; no answer within 0.3s: the machine may be asleep, or a firewall drops '
        "the connection"
    )
    assert lines[2] == 'endpoint "mac" is online again (was asleep)'
    assert lines[3].startswith('endpoint "mac" is degraded: credential rejected (HTTP 401); the server refused')
    assert "--credential-from-env" in lines[3]  # and what to change
    assert lines[4].startswith('endpoint "mac" is unreachable: connection refused; ') and "OLLAMA_HOST" in lines[4]
    assert f"[endpoint: cannot connect to 127.0.0.1:{port}: " in changes(caplog, "mac", detail=True)[4]
    assert lines[5] == 'endpoint "mac" is online again (was unreachable)'
    assert len(lines) == 6, lines


async def test_an_endpoint_refused_by_the_ssrf_guard_says_so(
    emulator: EmulatorFactory, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnout")
    mac = await emulator("mac", ["llama3.2:latest"])
    gw = await gateway([])  # no private-network opt-in: 127.0.0.1 is refused before any dial
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http,
        http.post(f"{gw.url}/admin/api/endpoints", json={"name": "mac", "url": mac.url, "api": "ollama"}) as resp,
    ):
        assert resp.status == 201
    status, body = await chat(gw, "mac/llama3.2")
    assert status == 503 and body["error"]["message"] == (
        'no healthy worker for "mac/llama3.2": mac down (unreachable: SSRF guard: private address not allowed)'
    )
    (line,) = changes(caplog, "mac")
    assert line.startswith('endpoint "mac" is unreachable: SSRF guard: private address not allowed; ')
    assert "APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS=true" in line and mac.served() == 0


async def test_a_model_whose_requests_keep_failing_is_out_with_their_status(
    emulator: EmulatorFactory, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnout")
    emu = await emulator("a", ["llama3:latest"], fail_status=500)  # its listings answer; inference says 500
    gw = await gateway([worker("a", emu.url)], health={"interval_s": 3600, "request_failures_to_down": 2})
    for _ in range(2):
        assert (await chat(gw, "llama3"))[0] == 502
    status, body = await chat(gw, "llama3")
    assert status == 503
    # the worker answered (badly): the model is out on it, the worker is not down
    assert (
        body["error"]["message"] == 'no healthy worker for "llama3": a down for this model (requests failing: HTTP 500)'
    )
    assert changes(caplog, "a") == ['worker "a" is up']
    (line,) = [r.getMessage() for r in caplog.records if 'worker "a": model "llama3:latest" is out' in r.getMessage()]
    assert "(requests failing: HTTP 500) after 2 failed requests in a row" in line
