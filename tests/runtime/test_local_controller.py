"""The local ModelClaim controller against a real runtime agent running real llama.cpp engines."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.runtime.conftest import AgentStarter
from turnout.controller.local import ClaimFiles, LocalController, Pool, load_claim_documents
from turnout.core.claims import POOL_LABEL, ClaimPhase, InvalidClaim
from turnout.runtime.agent import SUPERVISOR
from turnout.upstream.client import UpstreamClient

CLAIM = """
apiVersion: model.aibrix.ai/v1alpha1
kind: ModelClaim
metadata: {name: tiny-claim}
spec:
  modelName: tiny
  podSelector: {matchLabels: {pool: cpu}}
  artifactURL: file://MODEL
  engine: llamacpp
  engineConfig: {args: {"--ctx-size": "256"}}
---
apiVersion: model.aibrix.ai/v1alpha1
kind: ModelClaim
metadata: {name: nowhere}
spec:
  podSelector: {matchLabels: {pool: gpu}}
  artifactURL: hf://org/big
"""


@pytest.fixture
async def controller(start_agent: AgentStarter, tmp_path: Path) -> AsyncIterator[tuple[LocalController, web.AppRunner]]:
    url, runner = await start_agent()
    client = UpstreamClient(connect_timeout_s=2, total_timeout_s=30)
    pool = Pool("cpu-0", url, "127.0.0.1", 1, {"pool": "cpu", POOL_LABEL: "true"})
    yield LocalController(ClaimFiles(tmp_path / "data"), [pool], client), runner
    await client.close()


async def tick_until(ctl: LocalController, claim: str, phase: ClaimPhase | None, limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        await ctl.tick()
        if ctl.phase(claim) is phase:
            return
    raise AssertionError(f"{claim} is {ctl.phase(claim)}, wanted {phase}")


async def test_claim_lifecycle(controller: tuple[LocalController, web.AppRunner], tiny_model: Path) -> None:
    ctl, agent = controller
    for doc in load_claim_documents(CLAIM.replace("MODEL", str(tiny_model))):
        ctl.files.apply(doc)
    await ctl.tick()  # placed and activated: the engine boots
    placed = ctl.files.statuses()["tiny-claim"]
    engine_port = agent.app[SUPERVISOR].engines["tiny"].port
    # as AIBrix does, the instance has the engine's port from the activation's answer on; `port` (routable)
    # and the routing annotation stay 0 until the engine is ready
    assert placed["phase"] == "Scheduling" and placed["port"] == 0
    assert placed["instances"] == [{"pod": "cpu-0", "port": engine_port, "phase": "Scheduling"}]
    await tick_until(ctl, "tiny-claim", ClaimPhase.ACTIVE)
    status = ctl.files.statuses()
    assert status["tiny-claim"]["pod"] == "cpu-0" and status["tiny-claim"]["port"] > 0
    note = json.loads(ctl.annotations["cpu-0"]["modelclaim.aibrix.ai/tiny-claim"])
    assert note == {"model": "tiny", "port": status["tiny-claim"]["port"], "state": "active"}
    # no pool takes it: it remains Scheduling (the design), unbound, with the reason and one Warning event
    nowhere = status["nowhere"]
    assert (nowhere["phase"], nowhere["reason"], nowhere["pod"]) == ("Scheduling", "NoCandidatePod", None)
    assert "podSelector" in nowhere["message"]
    events = [(e["type"], e["reason"], e["count"]) for e in ctl.files.events() if e["object"] == "ModelClaim/nowhere"]
    assert events == [("Warning", "NoCandidatePod", 1)]
    # AIBrix's ModelClaimStatus fields
    tiny = status["tiny-claim"]
    assert tiny["candidates"] == 1 and tiny["desiredReplicas"] == 1
    assert tiny["instances"] == [{"pod": "cpu-0", "port": tiny["port"], "phase": "Active"}]
    assert status["nowhere"]["candidates"] == 0 and status["nowhere"]["instances"] == []

    ctl.files.mark_deleted("tiny-claim")
    await tick_until(ctl, "tiny-claim", None)  # de-routed, engine stopped, then forgotten
    assert "modelclaim.aibrix.ai/tiny-claim" not in ctl.annotations["cpu-0"]
    assert agent.app[SUPERVISOR].engines == {}
    assert [d["metadata"]["name"] for d in ctl.files.all()] == ["nowhere"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("kind: Pod\nmetadata: {name: x}\n", "kind must be ModelClaim"),
        ("kind: ModelClaim\nmetadata: {}\nspec: {}\n", "metadata.name"),
        (
            "kind: ModelClaim\nmetadata: {name: x}\nspec: {podSelector: {matchLabels: {a: b}}, artifactURL: hf://x, "
            "replicas: 3}\n",
            "replicas must be 1",
        ),
    ],
)
def test_bad_claim_documents(text: str, fragment: str) -> None:
    with pytest.raises(InvalidClaim, match=fragment):
        load_claim_documents(text)


async def test_changed_and_recreated_claims_get_new_engines(
    controller: tuple[LocalController, web.AppRunner], tiny_model: Path
) -> None:
    ctl, agent = controller
    engines = agent.app[SUPERVISOR].engines
    first = load_claim_documents(CLAIM.replace("MODEL", str(tiny_model)))[0]
    ctl.files.apply(first)
    await tick_until(ctl, "tiny-claim", ClaimPhase.ACTIVE)
    pid, uid = engines["tiny"].pid, ctl.files.all()[0]["metadata"]["uid"]

    # re-applied with other args: de-routed, stopped, started again with them
    changed = {**first, "spec": {**first["spec"], "engineConfig": {"args": {"--ctx-size": "128"}}}}
    ctl.files.apply(changed)
    assert ctl.files.all()[0]["metadata"]["uid"] == uid  # an update keeps the claim's identity
    await tick_until(ctl, "tiny-claim", ClaimPhase.LOADING)
    assert ctl.statuses["tiny-claim"]["reason"] in ("SpecChanged", "Activating", "Loading")
    await tick_until(ctl, "tiny-claim", ClaimPhase.ACTIVE)
    assert engines["tiny"].args == {"--ctx-size": "128"} and engines["tiny"].pid != pid

    # deleted, then created again under the same name: a new claim, so a new engine (not a remembered answer)
    ctl.files.mark_deleted("tiny-claim")
    await tick_until(ctl, "tiny-claim", None)
    assert "tiny" not in engines
    ctl.files.apply(first)
    assert ctl.files.all()[0]["metadata"]["uid"] != uid
    await tick_until(ctl, "tiny-claim", ClaimPhase.ACTIVE)
    assert engines["tiny"].args == {"--ctx-size": "256"}
