"""In-place sleep of vLLM and SGLang engines under a real agent, against the stand-ins of
tests/support/engine_emulator.py (vLLM's sleep mode needs a GPU; SGLang does not run here). The stand-ins follow
upstream: vLLM's /health stays 200 while it sleeps and only /is_sleeping says so; SGLang's /health takes seconds
and its /metrics exists only with --enable-metrics."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import eventually
from tests.runtime.conftest import AgentStarter
from tests.runtime.test_agent import Agent
from tests.runtime.test_nvml_snapshot import FakeNvml
from turnout.controller.local import ClaimFiles, LocalController, Pool, load_claim_documents
from turnout.core.claims import POOL_LABEL, ClaimPhase
from turnout.runtime.agent import SUPERVISOR
from turnout.runtime.nvml import Nvml
from turnout.runtime.supervisor import process_start_time
from turnout.upstream.client import UpstreamClient

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


async def test_an_adopted_engine_that_never_answers_is_restarted_after_its_boot_timeout(
    start_agent: AgentStarter, emulator_python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-adoption checks the PID start time and the health endpoint: a live process that never answers is
    booting only until the engine's own boot timeout (vLLM's VLLM_ENGINE_READY_TIMEOUT_S, read from the agent's
    environment as the engine reads it), then killed and restarted like a crashed engine, the snapshot's
    last_error saying why."""
    monkeypatch.setenv("EMULATOR_BOOT_S", "3600")  # this process never gets to listening
    url, runner = await start_agent(engine_python={"vllm": emulator_python})
    a = Agent(url, runner)
    status, _ = await a.call("POST", "/v1/runtime/models/activate", VLLM)
    assert status == 200
    stuck = await a.engine("v")
    assert stuck["phase"] == "booting" and stuck["pid"] is not None
    await runner.app[SUPERVISOR].close()
    await runner.cleanup()

    monkeypatch.setenv("EMULATOR_BOOT_S", "0")  # the engine started again boots at once
    monkeypatch.setenv("VLLM_ENGINE_READY_TIMEOUT_S", "2")
    url, runner = await start_agent(engine_python={"vllm": emulator_python})
    b = Agent(url, runner)
    adopted = await b.engine("v")
    assert adopted["phase"] == "booting" and adopted["pid"] == stuck["pid"] and adopted["alive"] is True
    active = await b.until("v", "active", limit_s=30)
    assert active["pid"] != stuck["pid"] and active["restart_count"] == 1 and active["port"] == stuck["port"]
    assert process_start_time(stuck["pid"]) is None  # the stuck process is gone
    _, snapshot = await b.call("GET", "/v1/runtime/snapshot")
    [model] = snapshot["models"]
    assert model["last_error"].startswith(
        f"did not answer GET /health within 2 s of its re-adoption (pid {stuck['pid']}); killed"
    ), model["last_error"]
    assert "VLLM_ENGINE_READY_TIMEOUT_S" in model["last_error"]
    status, answer = await chat(active["port"], "v")
    assert status == 200 and answer["choices"][0]["message"]["content"] == "hello"


async def test_an_engine_that_never_answers_fails_after_its_restarts(
    start_agent: AgentStarter, emulator_python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every boot has the deadline, not only an adopted one: an engine that never answers is killed at its boot
    timeout (here ``--boot-timeout-s 1``) and restarted like a crashed one, and after the restarts it is failed."""
    monkeypatch.setenv("EMULATOR_BOOT_S", "3600")
    url, runner = await start_agent(engine_python={"vllm": emulator_python}, boot_timeout_s=1)
    a = Agent(url, runner)
    status, _ = await a.call("POST", "/v1/runtime/models/activate", VLLM)
    assert status == 200
    failed = await a.until("v", "failed", limit_s=60)
    assert failed["restart_count"] == 5 and failed["alive"] is False and failed["pid"] is None
    assert failed["last_error"].startswith("did not answer GET /health within 1 s of its start; killed")
    assert "--boot-timeout-s" in failed["last_error"]


GPU_CLAIMS = """
kind: ModelClaim
metadata: {name: v}
spec: {podSelector: {matchLabels: {pool: gpu}}, artifactURL: "hf://org/tiny", engine: vllm}
---
kind: ModelClaim
metadata: {name: s}
spec: {podSelector: {matchLabels: {pool: gpu}}, artifactURL: "hf://org/tiny", engine: sglang}
"""


@pytest.mark.parametrize("by_stop", [False, True])
async def test_idle_sleep_takes_vllm_on_one_gpu_and_sglang_only_with_the_switch(
    start_agent: AgentStarter,
    emulator_python: str,
    kvcached_on_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    by_stop: bool,
) -> None:
    """The design's idle sleep is vLLM's: on a pod whose agent reports one GPU, an idle vLLM engine sleeps
    without any switch, while an idle SGLang engine beside it sleeps only with ``lifecycle.sleepByStop``
    (Turnout's extension). Idleness is read from each engine's own /metrics through the agent. The two engines
    share the GPU, so their interpreter has kvcached (``kvcached_on_path``), as on the kvcached runtime image."""
    monkeypatch.setenv("EMULATOR_HEALTH_S", "1")
    url, runner = await start_agent(
        engine_python={"vllm": emulator_python, "sglang": emulator_python}, nvml=Nvml(FakeNvml({}))
    )
    policy = json.dumps({"lifecycle": {"sleepAfterSeconds": 30, "sleepByStop": by_stop}})
    pool = Pool("gpu-0", url, "127.0.0.1", 1, {"pool": "gpu", POOL_LABEL: "true"}, policy)
    now = [1_000_000.0]
    client = UpstreamClient(connect_timeout_s=2, total_timeout_s=30)
    try:
        ctl = LocalController(ClaimFiles(tmp_path / "data"), [pool], client, clock=lambda: now[0])
        for doc in load_claim_documents(GPU_CLAIMS):
            ctl.files.apply(doc)

        async def both_active() -> bool:
            await ctl.tick()
            return ctl.phase("v") is ClaimPhase.ACTIVE and ctl.phase("s") is ClaimPhase.ACTIVE

        await eventually(both_active, "both claims Active", limit_s=60)
        for _ in range(3):  # idle observations 31 s apart (the controller's clock): asleep after the second
            await ctl.tick()
            now[0] += 31
        engines = runner.app[SUPERVISOR].engines
        assert engines["v"].phase == "sleeping" and ctl.phase("v") is ClaimPhase.SLEEPING
        assert engines["s"].phase == ("sleeping" if by_stop else "active")
        assert ctl.phase("s") is (ClaimPhase.SLEEPING if by_stop else ClaimPhase.ACTIVE)
        slept = sorted(e["object"] for e in ctl.files.events() if e["reason"] == "IdleSleep")
        assert slept == (["ModelClaim/s", "ModelClaim/v"] if by_stop else ["ModelClaim/v"])
    finally:
        await client.close()
