"""Pool policy, controller metrics and events end to end: real agent, real llama.cpp engines, real kvcached
segments in /dev/shm, the gateway's in-process controller, and a real redis-server for cross-replica wakes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
from pathlib import Path
from typing import Any

import aiohttp

from tests.conftest import Gateway, GatewayFactory, eventually
from tests.runtime.conftest import AgentStarter
from tests.runtime.test_gateway_claims import chat, until_status
from turnout.controller.local import ClaimFiles, LocalController, Pool, load_claim_documents
from turnout.core.claims import POOL_LABEL, ClaimPhase
from turnout.runtime.agent import SUPERVISOR
from turnout.upstream.client import UpstreamClient

CLAIM = """
kind: ModelClaim
metadata: {name: NAME}
spec:
  podSelector: {matchLabels: {pool: cpu}}
  artifactURL: file://MODEL
  engine: llamacpp
  engineConfig: {args: {"--ctx-size": "256"}}
"""
LABELS = {"pool": "cpu", POOL_LABEL: "true"}
PAGE = 2 << 20


def apply(files: ClaimFiles, name: str, model: Path) -> None:
    for doc in load_claim_documents(CLAIM.replace("NAME", name).replace("MODEL", str(model))):
        files.apply(doc)


async def get_text(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        return await r.text()


def pools(url: str, policy: Any) -> dict[str, Any]:
    agent = {"name": "cpu-0", "agent_url": url, "labels": LABELS, "policy": policy}
    return {"agents": [agent], "interval_s": 0.2}


async def test_idle_engine_sleeps_then_a_request_wakes_it(
    start_agent: AgentStarter, gateway: GatewayFactory, tiny_model: Path
) -> None:
    url, agent = await start_agent()
    gw = await gateway([], pools=pools(url, {"lifecycle": {"sleepAfterSeconds": 1.5, "sleepByStop": True}}))
    files = ClaimFiles(gw.settings.data_dir)
    apply(files, "idle", tiny_model)
    apply(files, "busy", tiny_model)
    await until_status(gw, "idle", 200)
    await until_status(gw, "busy", 200)
    engines = agent.app[SUPERVISOR].engines
    busy_pid = engines["busy"].pid

    async def idle_asleep() -> bool:
        await chat(gw, "busy")  # keeps "busy" in use: only the idle engine may sleep
        return engines["idle"].phase == "sleeping"

    await eventually(idle_asleep, "the idle engine to sleep", 30, every_s=0.1)
    assert engines["busy"].phase == "active" and engines["busy"].pid == busy_pid
    status, headers = await chat(gw, "idle")  # de-routed before it slept: the gateway answers, not the engine
    assert status == 503 and headers["Retry-After"] == "10"

    async def idle_woken() -> bool:
        await chat(gw, "busy")  # still in use while "idle" wakes (a loaded machine may take seconds)
        return (await chat(gw, "idle"))[0] == 200

    await eventually(idle_woken, "the request to wake the idle engine", every_s=0.1)
    events = ClaimFiles(gw.settings.data_dir).events()
    assert any(e["object"] == "ModelClaim/idle" and e["reason"] == "IdleSleep" for e in events)
    assert not any(e["object"] == "ModelClaim/busy" and e["reason"] == "IdleSleep" for e in events), events
    metrics = await get_text(f"{gw.url}/metrics")
    assert 'aibrix_modelclaim_pool_policy_valid{deployment="cpu-0",namespace="local"} 1.0' in metrics
    assert 'aibrix_modelclaim_ready_replicas{model="busy",namespace="local"} 1.0' in metrics
    assert 'aibrix_modelclaim_desired_replicas{model="idle",namespace="local"} 1.0' in metrics


async def test_invalid_pool_policy_is_disabled_with_one_event(
    start_agent: AgentStarter, gateway: GatewayFactory, tiny_model: Path
) -> None:
    url, agent = await start_agent()
    # "sleepAfter" is not a field: the whole policy is off, so the idle engine must not sleep
    gw = await gateway([], pools=pools(url, {"lifecycle": {"sleepAfter": 1}}))
    apply(ClaimFiles(gw.settings.data_dir), "tiny", tiny_model)
    await until_status(gw, "tiny", 200)
    await asyncio.sleep(2.5)  # > a valid policy's idle time, over a dozen ticks
    assert agent.app[SUPERVISOR].engines["tiny"].phase == "active"
    events = [e for e in ClaimFiles(gw.settings.data_dir).events() if e["reason"] == "InvalidPoolPolicy"]
    assert len(events) == 1 and events[0]["count"] == 1, events  # reported once, not every tick
    assert events[0]["object"] == "Pool/cpu-0" and "sleepAfter" in events[0]["message"]
    metrics = await get_text(f"{gw.url}/metrics")
    assert 'aibrix_modelclaim_pool_policy_valid{deployment="cpu-0",namespace="local"} 0.0' in metrics


async def test_engine_crashing_six_times_fails_the_claim(
    start_agent: AgentStarter, tiny_model: Path, tmp_path: Path
) -> None:
    url, agent = await start_agent()
    client = UpstreamClient(connect_timeout_s=2, total_timeout_s=30)
    ctl = LocalController(ClaimFiles(tmp_path / "data"), [Pool("cpu-0", url, "127.0.0.1", 1, LABELS)], client)
    try:
        apply(ctl.files, "crashy", tiny_model)
        apply(ctl.files, "steady", tiny_model)
        await tick_until_active(ctl, "crashy", "steady")
        engines = agent.app[SUPERVISOR].engines
        steady_pid = engines["steady"].pid
        seen_restarting = False
        for crash in range(6):
            pid = engines["crashy"].pid
            assert pid is not None, f"no process before crash {crash + 1}"
            os.killpg(pid, signal.SIGKILL)

            async def relaunched_or_failed(old: int = pid) -> bool:
                await ctl.tick()
                nonlocal seen_restarting
                seen_restarting |= ctl.statuses["crashy"]["reason"] == "Restarting"
                record = engines["crashy"]
                return record.phase == "failed" or (record.pid not in (None, old))

            await eventually(relaunched_or_failed, f"restart after crash {crash + 1}", every_s=0.1)
        await ctl.tick()
        status = ctl.statuses["crashy"]
        assert status["phase"] == "Failed" and status["reason"] == "EngineFailed"
        assert "exited" in status["message"]
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "False"
        assert seen_restarting
        assert engines["crashy"].restarts == 5  # six crashes: five restarts, then Failed
        assert engines["steady"].pid == steady_pid and ctl.phase("steady") is ClaimPhase.ACTIVE
        events = [e for e in ctl.files.events() if e["object"] == "ModelClaim/crashy"]
        assert events[-1]["type"] == "Warning" and events[-1]["reason"] == "EngineFailed"
        crashes = [e for e in events if e["reason"] == "Restarting"]
        assert crashes and all(e["type"] == "Warning" for e in crashes), crashes  # a crash is a warning
        samples = ctl.metrics.registry.get_sample_value
        assert (
            samples(
                "aibrix_modelclaim_activation_total", {"namespace": "local", "model": "crashy", "result": "failure"}
            )
            == 1
        )
        assert samples("aibrix_modelclaim_ready_replicas", {"namespace": "local", "model": "steady"}) == 1
    finally:
        await client.close()


async def tick_until_active(ctl: LocalController, *claims: str) -> None:
    async def active() -> bool:
        await ctl.tick()
        return all(ctl.phase(c) is ClaimPhase.ACTIVE for c in claims)

    await eventually(active, f"{claims} to be Active", every_s=0.1)


def write_segment(path: Path, total: int, used: int = 0, prealloc: int = 0) -> None:
    path.write_bytes(struct.pack("<qqq", total, used, prealloc))


async def test_kv_capacity_follows_demand(start_agent: AgentStarter, tiny_model: Path, tmp_path: Path) -> None:
    url, agent = await start_agent()
    client = UpstreamClient(connect_timeout_s=2, total_timeout_s=30)
    policy = json.dumps({"reclaim": {"mode": "kv-first", "capacityBytes": 10 * PAGE, "guaranteedFloorPercent": 10}})
    ctl = LocalController(ClaimFiles(tmp_path / "data"), [Pool("cpu-0", url, "127.0.0.1", 1, LABELS, policy)], client)
    demand = {"hot": (3, 0), "cold": (0, 0)}
    ctl.activity = lambda claim: demand.get(claim)  # what the gateway would count
    segments: list[Path] = []
    try:
        apply(ctl.files, "hot", tiny_model)
        apply(ctl.files, "cold", tiny_model)
        await tick_until_active(ctl, "hot", "cold")
        for name in ("hot", "cold"):  # what kvcached inside the engine would create
            path = Path("/dev/shm") / agent.app[SUPERVISOR].engines[name].ipc_name
            write_segment(path, 5 * PAGE, used=PAGE)
            segments.append(path)
        await ctl.tick()
        hot, cold = (struct.unpack("<qqq", p.read_bytes())[0] for p in segments)
        # 10 pages: 1 used each is protected, cold keeps its 10% floor, the rest follows hot's demand
        assert (hot, cold) == (9 * PAGE, 1 * PAGE)
    finally:
        for path in segments:
            path.unlink(missing_ok=True)
        await client.close()


async def test_one_wake_across_gateway_replicas_with_redis(
    start_agent: AgentStarter, gateway: GatewayFactory, tiny_model: Path, tmp_path: Path, redis_url: str
) -> None:
    url, _ = await start_agent()
    replicas: list[Gateway] = []
    for i in range(2):
        storage = {"data_dir": str(tmp_path / f"replica{i}"), "redis_url": redis_url}
        gw = await gateway([], storage=storage, pools=pools(url, None))
        apply(ClaimFiles(gw.settings.data_dir), "shared", tiny_model)
        replicas.append(gw)
    for gw in replicas:
        await until_status(gw, "shared", 200)
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{url}/v1/runtime/models/sleep", json={"model_name": "shared", "level": 1, "operation_id": "test-sleep"}
        ) as r,
    ):
        assert r.status == 200
    for gw in replicas:
        await until_status(gw, "shared", 503)
    results = await asyncio.gather(*(chat(gw, "shared") for gw in replicas for _ in range(10)))
    assert all(s in (200, 503) for s, _ in results)
    for gw in replicas:
        await until_status(gw, "shared", 200)
    text = await get_text(f"{url}/metrics")
    assert 'aibrix:modelclaim_lifecycle_operations_total{operation="wake",result="ok"} 1.0' in text
    assert sum(gw.app[_proxy_key()].claims.wakes_sent for gw in replicas) == 1


def _proxy_key() -> Any:
    from turnout.gateway.keys import PROXY

    return PROXY


async def test_a_woken_engine_is_awake_when_its_client_retries(
    start_agent: AgentStarter, gateway: GatewayFactory, tiny_model: Path
) -> None:
    """Issue 32, item 15: with sleepAfterSeconds (1) far under the Retry-After the 503 gives (10), an engine woken by
    a request went back to sleep before its client retried. A client that waits as it is told is now served."""
    url, agent = await start_agent()
    gw = await gateway([], pools=pools(url, {"lifecycle": {"sleepAfterSeconds": 1, "sleepByStop": True}}))
    apply(ClaimFiles(gw.settings.data_dir), "idle", tiny_model)
    await until_status(gw, "idle", 200)
    engine = agent.app[SUPERVISOR].engines["idle"]

    async def asleep() -> bool:
        return engine.phase == "sleeping"

    await eventually(asleep, "the idle engine to sleep", 30, every_s=0.1)
    status, headers = await chat(gw, "idle")
    assert status == 503
    await asyncio.sleep(int(headers["Retry-After"]))  # the client does as it is told
    assert (await chat(gw, "idle"))[0] == 200
    events = [e for e in ClaimFiles(gw.settings.data_dir).events() if e["reason"] == "IdleSleep"]
    assert events[-1]["count"] == 1, events  # it slept once, before the request, and not again since
