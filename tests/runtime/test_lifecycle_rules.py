"""Lifecycle rules of the local controller against a real runtime agent and real llama.cpp engines: a terminal
activation refusal, Kubernetes-style event aggregation and types, one IdleSleep event per sleep, and the
idle-sleep switch for engines that sleep by stopping on pods without a GPU."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import GatewayFactory, eventually, free_port
from tests.runtime.conftest import AgentStarter
from tests.runtime.test_gateway_claims import chat_code
from tests.runtime.test_pool_policy import get_text
from tests.support.claims import claim_yaml
from turnout.controller.local import ClaimFiles, LocalController, Pool, load_claim_documents
from turnout.core.claims import POOL_LABEL, ClaimPhase
from turnout.runtime.agent import SUPERVISOR
from turnout.upstream.client import UpstreamClient

LABELS = {"pool": "cpu", POOL_LABEL: "true"}
INVALID_ACTIVATIONS = 'aibrix:modelclaim_lifecycle_operations_total{operation="activate",result="invalid"} '


class Clock:
    """The controller's clock, moved on by the test (idle times without waiting for them)."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def local(start_agent: AgentStarter, tmp_path: Path) -> AsyncIterator[Any]:
    """Builds a local controller for one pool ("cpu-0") on a real agent, with the test's clock."""
    client = UpstreamClient(connect_timeout_s=2, total_timeout_s=30)
    url, agent = await start_agent()

    def make(policy: dict[str, Any] | None = None) -> tuple[LocalController, web.AppRunner, Clock]:
        clock = Clock()
        text = None if policy is None else json.dumps(policy)
        pool = Pool("cpu-0", url, "127.0.0.1", 1, LABELS, text)
        return LocalController(ClaimFiles(tmp_path / "data"), [pool], client, clock=clock), agent, clock

    yield make
    await client.close()


def apply(ctl: LocalController, text: str) -> None:
    for doc in load_claim_documents(text):
        ctl.files.apply(doc)


async def tick_until(ctl: LocalController, claim: str, phase: ClaimPhase) -> None:
    async def reached() -> bool:
        await ctl.tick()
        return ctl.phase(claim) is phase

    await eventually(reached, f"{claim} {phase.value}", every_s=0.05)


async def invalid_activations(agent_url: str) -> str | None:
    text = await get_text(f"{agent_url}/metrics")
    found = [line[len(INVALID_ACTIVATIONS) :] for line in text.splitlines() if line.startswith(INVALID_ACTIVATIONS)]
    return found[0] if found else None


def events_of(ctl: LocalController, obj: str) -> list[dict[str, Any]]:
    return [e for e in ctl.files.events() if e["object"] == obj]


NO_BOTO3 = "pip install 'turnout[s3]'"  # what an agent without boto3 answers an s3:// activation (HTTP 400)


async def test_an_activation_the_agent_refuses_fails_the_claim_once(
    local: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent whose Python has no boto3 refuses an s3:// artifact (HTTP 400), which the controller's own checks
    take: the claim goes Failed with the agent's reason and one Warning event, and is not activated again however
    many ticks follow, until its spec changes."""
    monkeypatch.setitem(sys.modules, "boto3", None)  # `import boto3` fails in the agent, as without the package
    ctl, agent, _ = local()
    url = ctl.pools["cpu-0"].agent_url
    apply(ctl, claim_yaml("bad", "x").replace("file://x", "s3://weights/model.gguf"))
    await tick_until(ctl, "bad", ClaimPhase.FAILED)
    status = ctl.statuses["bad"]
    assert status["reason"] == "ActivationRejected" and status["pod"] is None
    assert NO_BOTO3 in status["message"] and "cpu-0" in status["message"]
    for _ in range(5):
        await ctl.tick()
    assert ctl.phase("bad") is ClaimPhase.FAILED
    assert await invalid_activations(url) == "1.0"  # no retry loop
    assert "bad" not in agent.app[SUPERVISOR].engines
    assert "modelclaim.aibrix.ai/bad" not in ctl.annotations["cpu-0"]
    warnings = [e for e in events_of(ctl, "ModelClaim/bad") if e["type"] == "Warning"]
    assert [(e["reason"], e["count"]) for e in warnings] == [("ActivationRejected", 1)]

    # a changed spec is a new attempt (and refused again, once)
    apply(ctl, claim_yaml("bad", "x").replace("file://x", "s3://weights/other.gguf"))
    await ctl.tick()
    assert ctl.phase("bad") is ClaimPhase.FAILED and await invalid_activations(url) == "2.0"
    for _ in range(3):
        await ctl.tick()
    assert await invalid_activations(url) == "2.0"


async def test_a_refused_claim_is_answered_503_without_retry_after(
    start_agent: AgentStarter, gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # the agent refuses s3:// (HTTP 400), as without boto3
    url, _ = await start_agent()
    agents = [{"name": "cpu-0", "agent_url": url, "labels": LABELS}]
    gw = await gateway([], pools={"agents": agents, "interval_s": 0.1})
    for doc in load_claim_documents(claim_yaml("bad", "x").replace("file://x", "s3://weights/model.gguf")):
        ClaimFiles(gw.settings.data_dir).apply(doc)

    async def failed() -> tuple[int, dict[str, str], str | None] | None:
        answer = await chat_code(gw, "bad")
        return answer if answer[2] == "model_failed" else None

    status, headers, _ = await eventually(failed, "the claim's own Failed answer", every_s=0.05)
    assert status == 503 and "Retry-After" not in headers
    assert await invalid_activations(url) == "1.0"


async def test_repeated_events_aggregate_and_unreachable_agents_are_warnings(local: Any, tiny_model: Path) -> None:
    """An agent that stops answering, comes back, and stops again: one AgentUnreachable Warning event with
    count 2 (as Kubernetes aggregates repeats), not one entry per occurrence."""
    ctl, _, _ = local()
    apply(ctl, claim_yaml("tiny", tiny_model))
    await tick_until(ctl, "tiny", ClaimPhase.ACTIVE)
    live = ctl.pools["cpu-0"]
    dead = replace(live, agent_url=f"http://127.0.0.1:{free_port()}")  # nothing listens there
    for _ in range(2):
        ctl.pools["cpu-0"] = dead
        await ctl.tick()
        assert ctl.statuses["tiny"]["reason"] == "AgentUnreachable"
        ctl.pools["cpu-0"] = live
        await tick_until(ctl, "tiny", ClaimPhase.ACTIVE)
    unreachable = [e for e in events_of(ctl, "ModelClaim/tiny") if e["reason"] == "AgentUnreachable"]
    assert len(unreachable) == 1, unreachable
    assert unreachable[0]["type"] == "Warning" and unreachable[0]["count"] == 2
    ready = [e for e in events_of(ctl, "ModelClaim/tiny") if e["reason"] == "Ready"]
    assert len(ready) == 1 and ready[0]["count"] == 3 and ready[0]["type"] == "Normal"
    assert ctl.files.events()[-1]["reason"] == "Ready"  # a repeat moves to the end, with its new last time


async def test_one_idle_sleep_event_per_sleep(local: Any, tiny_model: Path) -> None:
    ctl, agent, clock = local({"lifecycle": {"sleepAfterSeconds": 30, "sleepByStop": True}})
    ctl.activity = lambda claim: (0, 0)  # the gateway's count: nothing sent to the engine
    apply(ctl, claim_yaml("tiny", tiny_model))
    await tick_until(ctl, "tiny", ClaimPhase.ACTIVE)
    engines = agent.app[SUPERVISOR].engines
    for _ in range(3):  # idle observations 31 s apart: asleep after the second
        await ctl.tick()
        clock.now += 31
    assert engines["tiny"].phase == "sleeping" and ctl.phase("tiny") is ClaimPhase.SLEEPING
    for _ in range(3):
        await ctl.tick()
        clock.now += 31
    idle = [e for e in events_of(ctl, "ModelClaim/tiny") if e["reason"] == "IdleSleep"]
    assert [(e["type"], e["count"]) for e in idle] == [("Normal", 1)], idle
    assert "idle" in idle[0]["message"]


@pytest.mark.parametrize("policy", [{"sleepAfterSeconds": 30}, {"sleepAfterSeconds": 30, "sleepByStop": False}])
async def test_llama_cpp_on_a_cpu_pod_idles_into_sleep_only_with_the_switch(
    local: Any, tiny_model: Path, policy: dict[str, Any]
) -> None:
    """llama.cpp sleeps by stopping and the agent reports no GPU: outside the design's idle sleep, so without
    ``lifecycle.sleepByStop`` the engine stays up however long it idles."""
    ctl, agent, clock = local({"lifecycle": policy})
    ctl.activity = lambda claim: (0, 0)
    apply(ctl, claim_yaml("tiny", tiny_model))
    await tick_until(ctl, "tiny", ClaimPhase.ACTIVE)
    for _ in range(5):
        await ctl.tick()
        clock.now += 31
    assert agent.app[SUPERVISOR].engines["tiny"].phase == "active" and ctl.phase("tiny") is ClaimPhase.ACTIVE
    assert not [e for e in events_of(ctl, "ModelClaim/tiny") if e["reason"] == "IdleSleep"]
