"""The gateway and sleeping claims, without Redis: exactly one wake per sleep, and a sleeping claimed model stays
listed. Real gateway, real agent, real llama.cpp engine; the test drives the in-process controller's ticks
itself, so the claim's status lags behind the engine exactly as long as the test says."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from tests.conftest import Gateway, GatewayFactory, eventually
from tests.runtime.conftest import AgentStarter
from tests.runtime.test_gateway_claims import chat_code
from tests.runtime.test_pool_policy import get_text
from tests.support.claims import claim_yaml
from turnout.controller.local import ClaimFiles, load_claim_documents
from turnout.core.claims import ClaimPhase
from turnout.core.reconcile import ANNOTATION_PREFIX, EngineInfo, SetStatus, route_annotation
from turnout.fleet.claims import ClaimBindings
from turnout.gateway.keys import PROXY
from turnout.runtime.agent import SUPERVISOR

LABELS = {"pool": "cpu", "pool.aibrix.ai/enabled": "true"}
WAKES = 'aibrix:modelclaim_lifecycle_operations_total{operation="wake",result="ok"} '


async def paused_gateway(gateway: GatewayFactory, agent_url: str) -> tuple[Gateway, ClaimBindings]:
    """A gateway whose claims loop is stopped: the test ticks the controller itself (``tick``)."""
    gw = await gateway([], pools={"agents": [{"name": "cpu-0", "agent_url": agent_url, "labels": LABELS}]})
    claims = gw.app[PROXY].claims
    assert claims is not None
    await claims.stop()
    return gw, claims


async def tick(claims: ClaimBindings) -> None:
    await claims.source.refresh()
    claims.sync()


async def tick_until(claims: ClaimBindings, model: str, phase: ClaimPhase) -> None:
    async def reached() -> bool:
        await tick(claims)
        return claims.phases.get(model, ("", None))[1] is phase

    await eventually(reached, f"{model} {phase.value}", every_s=0.05)


async def sleep_engine(agent_url: str, model: str) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{agent_url}/v1/runtime/models/sleep",
            json={"model_name": model, "level": 1, "operation_id": uuid.uuid4().hex},
        ) as r,
    ):
        assert r.status == 200


async def wakes_counted(agent_url: str) -> str | None:
    text = await get_text(f"{agent_url}/metrics")
    found = [line[len(WAKES) :] for line in text.splitlines() if line.startswith(WAKES)]
    return found[0] if found else None


async def wake_tasks_done(claims: ClaimBindings) -> None:
    await asyncio.gather(*claims._wakes.values(), return_exceptions=True)


async def listed(gw: Gateway) -> tuple[list[str], list[str]]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gw.url}/v1/models") as r:
            openai = [m["id"] for m in (await r.json())["data"]]
        async with http.get(f"{gw.url}/api/tags") as r:
            ollama = [m["name"] for m in (await r.json())["models"]]
    return openai, ollama


async def test_one_wake_per_sleep_whatever_arrives(
    start_agent: AgentStarter, gateway: GatewayFactory, tiny_model: Path
) -> None:
    url, _ = await start_agent()
    gw, claims = await paused_gateway(gateway, url)
    for doc in load_claim_documents(claim_yaml("alpha", tiny_model)):
        ClaimFiles(gw.settings.data_dir).apply(doc)
    await tick_until(claims, "alpha", ClaimPhase.ACTIVE)
    await sleep_engine(url, "alpha")
    await tick_until(claims, "alpha", ClaimPhase.SLEEPING)

    answers = await asyncio.gather(*(chat_code(gw, "alpha") for _ in range(10)))
    assert {(s, h["Retry-After"], c) for s, h, c in answers} == {(503, "10", "model_waking")}
    await wake_tasks_done(claims)  # the first wake is sent and its task has finished; the engine boots
    # The status still says Sleeping (no tick yet): retries now must not wake it again.
    for _ in range(3):
        retries: list[Any] = await asyncio.gather(*(chat_code(gw, "alpha") for _ in range(5)))
        assert all(s == 503 for s, _, _ in retries)
        await wake_tasks_done(claims)
    assert claims.wakes_sent == 1
    assert await eventually(lambda: wakes_counted(url), "the agent counted the wake", every_s=0.05) == "1.0"

    await tick_until(claims, "alpha", ClaimPhase.ACTIVE)
    assert (await chat_code(gw, "alpha"))[0] == 200
    # a second sleep is a new sleep: one more wake
    await sleep_engine(url, "alpha")
    await tick_until(claims, "alpha", ClaimPhase.SLEEPING)
    await asyncio.gather(*(chat_code(gw, "alpha") for _ in range(5)))
    await wake_tasks_done(claims)
    await asyncio.gather(*(chat_code(gw, "alpha") for _ in range(5)))
    await wake_tasks_done(claims)
    assert claims.wakes_sent == 2
    assert await eventually(lambda: wakes_counted(url), "the second wake", every_s=0.05) == "2.0"


async def test_a_sleeping_claimed_model_stays_listed_and_a_request_wakes_it(
    start_agent: AgentStarter, gateway: GatewayFactory, tiny_model: Path
) -> None:
    url, _ = await start_agent()
    gw, claims = await paused_gateway(gateway, url)
    for doc in load_claim_documents(claim_yaml("alpha", tiny_model)):
        ClaimFiles(gw.settings.data_dir).apply(doc)
    await tick_until(claims, "alpha", ClaimPhase.ACTIVE)
    assert await listed(gw) == (["alpha"], ["alpha"])
    await sleep_engine(url, "alpha")
    await tick_until(claims, "alpha", ClaimPhase.SLEEPING)
    assert await listed(gw) == (["alpha"], ["alpha"])  # OpenWebUI and the like offer only what is listed

    status, headers, code = await chat_code(gw, "alpha")
    assert (status, headers.get("Retry-After"), code) == (503, "10", "model_waking")
    await wake_tasks_done(claims)

    async def served() -> bool:
        await tick(claims)
        return (await chat_code(gw, "alpha"))[0] == 200

    await eventually(served, "alpha served again after the request woke it", every_s=0.05)
    assert await listed(gw) == (["alpha"], ["alpha"])


async def test_a_request_as_the_claim_turns_sleeping_is_followed_by_a_wake(
    start_agent: AgentStarter, gateway: GatewayFactory, tiny_model: Path
) -> None:
    """Issue 32, item 14: the pool policy takes the claim's route away (Sleeping) before it puts the engine to
    sleep. A request in between is told the model is being woken; the wake then waits for the sleep and wakes the
    engine, with no other request coming."""
    url, agent = await start_agent()
    gw, claims = await paused_gateway(gateway, url)
    for doc in load_claim_documents(claim_yaml("alpha", tiny_model)):
        ClaimFiles(gw.settings.data_dir).apply(doc)
    await tick_until(claims, "alpha", ClaimPhase.ACTIVE)
    engine = agent.app[SUPERVISOR].engines["alpha"]
    controller = claims.source.controller  # type: ignore[attr-defined]
    looked = asyncio.Event()
    wake_target = claims.source.wake_target

    async def looking(key: str) -> Any:
        found = await wake_target(key)
        looked.set()
        return found

    claims.source.wake_target = looking  # type: ignore[method-assign]
    # what the policy's idle sleep does first (LocalController._pool_policy, set_route): the route, the status
    pod = controller.statuses["alpha"]["pod"]
    sleeping = route_annotation("alpha", EngineInfo("sleeping", False, engine.port))
    controller._annotate(pod, ANNOTATION_PREFIX + "alpha", sleeping)
    controller._set_status(SetStatus("alpha", ClaimPhase.SLEEPING, "Sleeping", "", pod, 0, engine.port), "alpha")
    claims.sync()
    status, headers, code = await chat_code(gw, "alpha")
    assert (status, headers.get("Retry-After"), code) == (503, "10", "model_waking")
    await asyncio.wait_for(looked.wait(), 30)  # the wake looked at the engine: still awake
    assert engine.phase == "active" and claims.wakes_sent == 0
    await sleep_engine(url, "alpha")  # then the policy's sleep
    assert await eventually(lambda: wakes_counted(url), "the wake, with no request after the first", 30) == "1.0"
    assert claims.wakes_sent == 1

    async def served() -> bool:
        await tick(claims)
        return (await chat_code(gw, "alpha"))[0] == 200

    await eventually(served, "alpha served again", every_s=0.05)
