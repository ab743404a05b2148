"""In-place sleep of vLLM and SGLang engines under a real agent, against the stand-ins of
tests/support/engine_emulator.py (vLLM's sleep mode needs a GPU; SGLang does not run here). The stand-ins follow
upstream: vLLM's /health stays 200 while it sleeps and only /is_sleeping says so; SGLang's /health takes seconds
and its /metrics exists only with --enable-metrics."""

from __future__ import annotations

import os
import signal
import socket
from typing import Any

import aiohttp
import pytest

from tests.conftest import eventually
from tests.runtime.conftest import AgentStarter
from tests.runtime.test_agent import Agent
from turnout.runtime.agent import SUPERVISOR

VLLM = {"model_name": "v", "artifact_url": "hf://org/tiny", "engine": "vllm"}


async def emulator(port: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/emulator/calls") as r:
        body: dict[str, Any] = await r.json()
        return body


async def engine_post(port: int, path: str, body: Any = None) -> int:
    async with aiohttp.ClientSession() as http, http.post(f"http://127.0.0.1:{port}{path}", json=body) as r:
        await r.read()
        return r.status


async def chat(port: int, model: str) -> tuple[int, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r,
    ):
        return r.status, await r.json()


async def agent_metrics(agent: Agent) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{agent.url}/metrics") as r:
        return await r.text()


async def stays_asleep(agent: Agent, name: str, port: int, ticks: int = 3) -> dict[str, Any]:
    """Wait until the agent's monitor has probed the engine ``ticks`` more times (or let it go awake), then
    return it: a sleep that holds is still sleeping after those ticks."""
    start = (await emulator(port))["probes"]

    async def probed_or_woken() -> dict[str, Any] | None:
        engine = await agent.engine(name)
        if engine["phase"] != "sleeping" or (await emulator(port))["probes"] >= start + ticks:
            return engine
        return None

    engine: dict[str, Any] = await eventually(probed_or_woken, f"{ticks} monitor probes of {name}", 20)
    assert engine["phase"] == "sleeping" and engine["ready"] is False, engine
    return engine


async def test_vllm_sleep_holds_across_monitor_ticks_and_an_agent_restart(
    start_agent: AgentStarter, emulator_python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMULATOR_WAKE_LAG_S", "1")  # /wake_up returns before the engine is awake
    url, runner = await start_agent(engine_python={"vllm": emulator_python})
    a = Agent(url, runner)
    status, _ = await a.call("POST", "/v1/runtime/models/activate", VLLM)
    assert status == 200
    active = await a.until("v", "active", limit_s=30)
    port = active["port"]

    status, slept = await a.call(
        "POST", "/v1/runtime/models/sleep", {"model_name": "v", "level": 1, "operation_id": "s1"}
    )
    assert status == 200 and slept["phase"] == "sleeping" and slept["applied"] is True
    assert (await a.engine("v"))["pid"] == active["pid"]  # in place
    await stays_asleep(a, "v", port)  # /health is 200 all along: only /is_sleeping tells
    assert "aibrix:modelclaim_models_resident 1.0" in await agent_metrics(a)  # sleeping still holds the model

    # the agent goes away and a new one adopts the sleeping engine as sleeping, same process
    await runner.app[SUPERVISOR].close()
    await runner.cleanup()
    url, runner = await start_agent(engine_python={"vllm": emulator_python})
    b = Agent(url, runner)
    adopted = await b.engine("v")
    assert adopted["phase"] == "sleeping" and adopted["pid"] == active["pid"] and adopted["ready"] is False
    await stays_asleep(b, "v", port)

    status, woken = await b.call("POST", "/v1/runtime/models/wake", {"model_name": "v", "operation_id": "w1"})
    assert status == 200 and woken["phase"] == "booting" and woken["applied"] is True  # not routable yet
    await b.until("v", "active", limit_s=20)
    assert (await emulator(port))["calls"] == ["/sleep?level=1&mode=wait", "/wake_up"]
    status, answer = await chat(port, "v")
    assert status == 200 and answer["choices"][0]["message"]["content"] == "hello"

    text = await agent_metrics(b)
    assert 'aibrix:modelclaim_engine_restarts{model="v"} 0.0' in text
    status, _ = await b.call("POST", "/v1/runtime/models/deactivate", {"model_name": "v"})
    assert status == 200
    text = await agent_metrics(b)
    assert 'model="v"' not in text and "aibrix:modelclaim_models_resident 0.0" in text


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def test_a_vllm_engine_that_exits_asleep_stays_asleep_until_woken(
    start_agent: AgentStarter, emulator_python: str
) -> None:
    """Asleep in place, the engine had given its GPU memory back; restarting it awake would take it again behind
    the controller's back. It stays asleep with no process (across an agent restart too) and starts on wake."""
    url, runner = await start_agent(engine_python={"vllm": emulator_python})
    a = Agent(url, runner)
    await a.call("POST", "/v1/runtime/models/activate", VLLM)
    active = await a.until("v", "active", limit_s=30)
    port = active["port"]
    status, _ = await a.call("POST", "/v1/runtime/models/sleep", {"model_name": "v", "level": 2, "operation_id": "s"})
    assert status == 200
    os.killpg(active["pid"], signal.SIGKILL)  # the engine dies in its sleep

    async def exited() -> dict[str, Any] | None:
        engine = await a.engine("v")
        return engine if engine["last_error"] else None

    crashed = await eventually(exited, "the agent to see the engine exit", 20)
    assert crashed["phase"] == "sleeping" and crashed["alive"] is False and crashed["pid"] is None, crashed
    assert crashed["ready"] is False and crashed["restart_count"] == 0 and crashed["port"] == port
    assert not listening(port)  # nothing was started to take the memory back

    # a new agent finds it asleep with no process and leaves it so
    await runner.app[SUPERVISOR].close()
    await runner.cleanup()
    url, runner = await start_agent(engine_python={"vllm": emulator_python})
    b = Agent(url, runner)
    kept = await b.engine("v")
    assert kept["phase"] == "sleeping" and kept["pid"] is None and kept["port"] == port, kept
    assert not listening(port)

    # a wake starts it: booting (not routable) until it answers, then active on the same port, awake
    status, woken = await b.call("POST", "/v1/runtime/models/wake", {"model_name": "v", "operation_id": "w"})
    assert status == 200 and woken["phase"] == "booting" and woken["applied"] is True
    started = await b.until("v", "active", limit_s=30)
    assert started["pid"] not in (None, active["pid"]) and started["port"] == port and started["sleep_level"] is None
    assert (await emulator(port))["calls"] == []  # a fresh engine: no /wake_up to a process that is gone
    status, answer = await chat(port, "v")
    assert status == 200 and answer["choices"][0]["message"]["content"] == "hello"


async def test_an_engine_still_booting_when_the_agent_restarts_is_adopted_and_waited_for(
    start_agent: AgentStarter, emulator_python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM refuses connections until its model is loaded; an agent restarting meanwhile adopts the live process
    as booting and waits for it (restarting it would only start the loading over)."""
    monkeypatch.setenv("EMULATOR_BOOT_S", "4")
    url, runner = await start_agent(engine_python={"vllm": emulator_python})
    a = Agent(url, runner)
    status, _ = await a.call("POST", "/v1/runtime/models/activate", VLLM)
    assert status == 200
    booting = await a.engine("v")
    assert booting["phase"] == "booting" and booting["pid"] is not None

    await runner.app[SUPERVISOR].close()
    await runner.cleanup()
    url, runner = await start_agent(engine_python={"vllm": emulator_python})
    b = Agent(url, runner)
    adopted = await b.engine("v")
    assert not listening(adopted["port"])  # re-adopted while the engine still boots
    assert adopted["phase"] == "booting" and adopted["ready"] is False, adopted
    assert adopted["pid"] == booting["pid"] and adopted["alive"] is True
    active = await b.until("v", "active", limit_s=30)
    assert active["pid"] == booting["pid"] and active["restart_count"] == 0  # the same process, never restarted
    status, answer = await chat(active["port"], "v")
    assert status == 200 and answer["choices"][0]["message"]["content"] == "hello"


async def test_vllm_sleep_state_followed_and_level_two_wake_reloads_weights(
    start_agent: AgentStarter, emulator_python: str
) -> None:
    url, runner = await start_agent(engine_python={"vllm": emulator_python})
    a = Agent(url, runner)
    await a.call("POST", "/v1/runtime/models/activate", VLLM)
    port = (await a.until("v", "active", limit_s=30))["port"]

    # slept behind the agent's back: the monitor reads /is_sleeping and takes it off the ready engines
    assert await engine_post(port, "/sleep?level=1") == 200
    await a.until("v", "sleeping", limit_s=10)
    assert await engine_post(port, "/wake_up") == 200
    await a.until("v", "active", limit_s=10)

    status, slept = await a.call(
        "POST", "/v1/runtime/models/sleep", {"model_name": "v", "level": 2, "operation_id": "s2"}
    )
    assert status == 200 and slept["phase"] == "sleeping" and (await a.engine("v"))["sleep_level"] == 2
    status, _ = await a.call("POST", "/v1/runtime/models/wake", {"model_name": "v", "operation_id": "w2"})
    assert status == 200
    await a.until("v", "active", limit_s=10)
    assert (await emulator(port))["calls"][-4:] == [
        "/sleep?level=2&mode=wait",
        "/wake_up?tags=weights",
        "/collective_rpc reload_weights",
        "/wake_up?tags=kv_cache",
    ]
    status, answer = await chat(port, "v")
    assert status == 200 and answer["choices"][0]["message"]["content"] == "hello"  # weights reloaded


async def test_sglang_is_ready_through_its_slow_health_and_reports_activity(
    start_agent: AgentStarter, emulator_python: str
) -> None:
    url, runner = await start_agent(engine_python={"sglang": emulator_python})
    a = Agent(url, runner)
    body = {"model_name": "s", "artifact_url": "hf://org/tiny", "engine": "sglang"}
    status, _ = await a.call("POST", "/v1/runtime/models/activate", body)
    assert status == 200
    engine = await a.until("s", "active", limit_s=30)  # its /health takes 3 s here (up to 20 s upstream)
    assert engine["request_metrics_observed"] is True  # /metrics is served
    assert (engine["requests_running"], engine["requests_waiting"], engine["request_success_total"]) == (0, 0, 0)

    status, slept = await a.call(
        "POST", "/v1/runtime/models/sleep", {"model_name": "s", "level": 1, "operation_id": "s"}
    )
    assert status == 200 and slept["phase"] == "sleeping"
    status, woken = await a.call("POST", "/v1/runtime/models/wake", {"model_name": "s", "operation_id": "w"})
    assert status == 200 and woken["phase"] == "booting"
    await a.until("s", "active", limit_s=30)
    assert (await emulator(engine["port"]))["calls"] == ["/release_memory_occupation", "/resume_memory_occupation"]
