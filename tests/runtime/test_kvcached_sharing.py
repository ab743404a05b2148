"""A second vLLM or SGLang engine on a pod's GPU needs kvcached (the pools design: engines share the GPU's memory
through it). Without it in the engine's interpreter the agent refuses to start the engine (phase ``failed``, a
``last_error`` that says why and what to change) instead of letting it fail for want of memory at every
restart; the claim goes Failed with a Warning event. Real agent, stand-in engines (tests/support/engine_emulator.py),
an NVML stand-in reporting one GPU (the agent's count of GPUs comes from NVML)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import eventually
from tests.runtime.conftest import AgentStarter
from tests.runtime.test_agent import Agent
from tests.runtime.test_nvml_snapshot import FakeNvml
from turnout.controller.local import ClaimFiles, LocalController, Pool, load_claim_documents
from turnout.core.claims import POOL_LABEL, ClaimPhase
from turnout.runtime.agent import SUPERVISOR
from turnout.runtime.nvml import Nvml
from turnout.upstream.client import UpstreamClient

V = {"model_name": "v", "artifact_url": "hf://org/tiny", "engine": "vllm"}
S = {"model_name": "s", "artifact_url": "hf://org/tiny", "engine": "sglang"}


async def _two_engines(start_agent: AgentStarter, emulator_python: str, gpus: bool) -> Agent:
    url, runner = await start_agent(
        engine_python={"vllm": emulator_python, "sglang": emulator_python},
        nvml=Nvml(FakeNvml({})) if gpus else None,
    )
    agent = Agent(url, runner)
    status, first = await agent.call("POST", "/v1/runtime/models/activate", V)
    assert status == 200 and first["phase"] == "booting", first
    await agent.until("v", "active")
    return agent


async def test_a_second_engine_on_the_gpu_without_kvcached_is_refused_not_crash_looped(
    start_agent: AgentStarter, emulator_python: str, tmp_path: Path
) -> None:
    agent = await _two_engines(start_agent, emulator_python, gpus=True)
    status, second = await agent.call("POST", "/v1/runtime/models/activate", S)
    assert status == 200 and second["phase"] == "failed", second
    engine = await agent.engine("s")
    assert engine["phase"] == "failed" and engine["restart_count"] == 0 and engine["pid"] is None, engine
    why = engine["last_error"]
    assert why.startswith("not started: s would be a second engine on this pod's GPU (beside v)"), why
    assert f"kvcached, which lets engines share a GPU's memory, cannot be imported by {emulator_python}" in why
    assert "kvcached runtime image" in why
    record = agent.runner.app[SUPERVISOR].engines["s"]
    assert record.pid is None and not any(p.name.startswith(record.ipc_name) for p in (tmp_path / "logs").glob("*"))
    assert (await agent.engine("v"))["phase"] == "active"  # the first engine is left alone
    # it stays failed (no restarts, no start) until it is deactivated and activated again
    again = await agent.until("s", "failed", restarts=0)
    assert again["last_error"] == why
    status, _ = await agent.call("POST", "/v1/runtime/models/deactivate", {"model_name": "s"})
    assert status == 200


@pytest.mark.parametrize("why", ["kvcached", "no GPU"])
async def test_a_second_engine_starts_with_kvcached_or_without_a_gpu(
    start_agent: AgentStarter, emulator_python: str, request: pytest.FixtureRequest, why: str
) -> None:
    if why == "kvcached":  # the engines' interpreter has kvcached, as on the kvcached runtime image
        request.getfixturevalue("kvcached_on_path")
    agent = await _two_engines(start_agent, emulator_python, gpus=why == "kvcached")
    status, second = await agent.call("POST", "/v1/runtime/models/activate", S)
    assert status == 200 and second["phase"] == "booting", second
    engine = await agent.until("s", "active")
    assert engine["last_error"] is None
    for name in ("s", "v"):
        await agent.call("POST", "/v1/runtime/models/deactivate", {"model_name": name})


CLAIMS = """\
kind: ModelClaim
metadata: {name: v}
spec: {podSelector: {matchLabels: {pool: gpu}}, artifactURL: "hf://org/tiny", engine: vllm}
---
kind: ModelClaim
metadata: {name: s}
spec: {podSelector: {matchLabels: {pool: gpu}}, artifactURL: "hf://org/tiny", engine: sglang}
"""


async def test_the_refused_claim_is_failed_with_a_warning_event_saying_why(
    start_agent: AgentStarter, emulator_python: str, tmp_path: Path
) -> None:
    url, runner = await start_agent(
        engine_python={"vllm": emulator_python, "sglang": emulator_python}, nvml=Nvml(FakeNvml({}))
    )
    pool = Pool("gpu-0", url, "127.0.0.1", 1, {"pool": "gpu", POOL_LABEL: "true"}, json.dumps({}))
    client = UpstreamClient(connect_timeout_s=2, total_timeout_s=30)
    try:
        ctl = LocalController(ClaimFiles(tmp_path / "data"), [pool], client)
        for doc in load_claim_documents(CLAIMS):
            ctl.files.apply(doc)

        async def settled() -> bool:
            await ctl.tick()
            phases = {ctl.phase("v"), ctl.phase("s")}
            return phases == {ClaimPhase.ACTIVE, ClaimPhase.FAILED}

        await eventually(settled, "one claim Active and the other Failed", limit_s=60)
        failed = "v" if ctl.phase("v") is ClaimPhase.FAILED else "s"
        events = [e for e in ctl.files.events() if e["object"] == f"ModelClaim/{failed}" and e["type"] == "Warning"]
        assert [e["reason"] for e in events] == ["EngineFailed"], ctl.files.events()
        assert "cannot be imported by" in events[0]["message"] and "kvcached" in events[0]["message"]
        assert runner.app[SUPERVISOR].engines[failed].restarts == 0
    finally:
        await client.close()
