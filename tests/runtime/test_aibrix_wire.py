"""Wire compatibility with AIBrix, checked with AIBrix's own published code (``aibrix`` 0.8.0 from PyPI).

Both directions: a Turnout agent's answers validate with AIBrix's protocol models (``aibrix.openapi.protocol``,
which refuse unknown fields: Turnout's own additions are named in :data:`MODEL_EXTENSIONS` and nothing else
may appear), and Turnout's local controller drives AIBrix's real runtime (its mock mode) to an Active claim.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aibrix.openapi import protocol as aibrix  # type: ignore[import-untyped]
from aiohttp import web
from pydantic import BaseModel

from tests.conftest import GatewayFactory, eventually, free_port, serve_app
from tests.runtime.conftest import AgentStarter
from tests.runtime.test_gateway_claims import chat_code
from tests.runtime.test_gateway_wake import paused_gateway, tick_until, wake_tasks_done
from tests.support.aibrix_runtime import AIBRIX_RUNTIME, REFUSED, aibrix_runtime_app
from turnout.controller.local import ClaimFiles, LocalController, Pool, load_claim_documents
from turnout.core.claims import POOL_LABEL, ClaimPhase
from turnout.runtime.agent import create_agent_app
from turnout.runtime.wire import MODEL_EXTENSIONS
from turnout.upstream.client import UpstreamClient


def aibrix_valid(model: type[BaseModel], body: dict[str, Any], extensions: tuple[str, ...] = ()) -> BaseModel:
    """``body`` as AIBrix's ``model`` reads it; fields beyond the model's must be among ``extensions``."""
    extra = set(body) - set(model.model_fields)
    assert extra <= set(extensions), f"fields AIBrix's {model.__name__} does not know: {sorted(extra)}"
    return model.model_validate({k: v for k, v in body.items() if k in model.model_fields})


class Agent:
    def __init__(self, url: str) -> None:
        self.url = url

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as http, http.request(method, f"{self.url}{path}", json=body) as r:
            return r.status, await r.json()


@pytest.fixture
async def mock_agent(tmp_path: Path) -> AsyncIterator[Agent]:
    low = free_port()
    app = create_agent_app(
        registry_path=tmp_path / "engines.json",
        log_dir=tmp_path / "logs",
        port_range=(low, low + 10),
        cache_dir=tmp_path / "cache",
        mock=True,
    )
    url, runner = await serve_app(app)
    yield Agent(url)
    await runner.cleanup()


async def test_every_agent_answer_validates_with_aibrix_protocol_models(mock_agent: Agent, tmp_path: Path) -> None:
    a = mock_agent
    ref = {"namespace": "team", "name": "llama-claim", "uid": "0b6f"}
    request = {"model_name": "llama", "artifact_url": "s3://bucket/llama", "engine": "vllm", "claim_ref": ref}
    aibrix.ActivateRuntimeModelRequest.model_validate(request)  # the request as AIBrix's controller sends it
    status, body = await a.call("POST", "/v1/runtime/models/activate", request)
    assert status == 200
    activated = aibrix_valid(aibrix.ActivateRuntimeModelResponse, body, ("phase",))
    assert activated.status == "success" and activated.port > 0 and body["phase"] == "active"

    status, body = await a.call("GET", "/v1/runtime/snapshot")
    assert status == 200 and set(body) == set(aibrix.RuntimeSnapshotResponse.model_fields)
    for model in body["models"]:
        aibrix_valid(aibrix.RuntimeSnapshotModel, model, MODEL_EXTENSIONS)
    snap = aibrix.RuntimeSnapshotResponse.model_validate(
        {**body, "models": [{k: v for k, v in m.items() if k not in MODEL_EXTENSIONS} for m in body["models"]]}
    )
    (llama,) = snap.models
    assert llama.claim_ref is not None and llama.claim_ref.uid == "0b6f" and llama.restart_count == 0
    assert llama.kv_used_bytes == -1 and llama.request_metrics_observed is False  # unknown, not zero
    assert snap.observed_at.tzinfo is not None and snap.cached_artifacts == ["s3://bucket/llama"]  # its marker

    status, body = await a.call("GET", "/v1/runtime/models")
    assert status == 200
    (entry,) = aibrix.ListRuntimeModelsResponse.model_validate(
        {"models": [{k: v for k, v in m.items() if k in aibrix.RuntimeModelInfo.model_fields} for m in body["models"]]}
    ).models
    assert entry.phase == "active" and entry.ready and entry.kv_total_bytes == -1

    for path, op_body in [
        ("kv-limit", {"model_name": "llama", "limit_bytes": 1 << 30, "operation_id": "kv-1"}),
        ("sleep", {"model_name": "llama", "level": 1, "operation_id": "sleep-1"}),
        ("wake", {"model_name": "llama", "operation_id": "wake-1"}),
    ]:
        request_model = {
            "kv-limit": aibrix.SetRuntimeModelKVLimitRequest,
            "sleep": aibrix.SleepRuntimeModelRequest,
            "wake": aibrix.WakeRuntimeModelRequest,
        }[path]
        request_model.model_validate(op_body)
        status, body = await a.call("POST", f"/v1/runtime/models/{path}", op_body)
        assert status == 200
        result = aibrix_valid(aibrix.RuntimeOperationResponse, body)  # no field beyond AIBrix's
        assert result.applied is True and result.operation_id == op_body["operation_id"]
        # the same operation again is not carried out again (AIBrix: applied false, the phase as it is now)
        status, again = await a.call("POST", f"/v1/runtime/models/{path}", op_body)
        assert status == 200 and again == {**body, "applied": False}

    status, body = await a.call("POST", "/v1/runtime/models/deactivate", {"model_name": "llama", "mode": "stop"})
    assert status == 200 and body["status"] == "success"
    assert (await a.call("GET", "/v1/runtime/models"))[1] == {"models": []}


async def test_real_engine_snapshot_validates_with_aibrix_models(start_agent: AgentStarter, tiny_model: Path) -> None:
    """The same with a real llama.cpp engine behind the agent: booting, then active and serving."""
    url, _ = await start_agent()
    a = Agent(url)
    ref = {"namespace": "local", "name": "tiny", "uid": "u1"}
    body = {"model_name": "tiny", "artifact_url": f"file://{tiny_model}", "engine": "llamacpp", "claim_ref": ref}
    body["engine_config"] = {"args": {"--ctx-size": "256"}}
    status, answer = await a.call("POST", "/v1/runtime/models/activate", body)
    assert status == 200 and answer["phase"] == "booting"

    async def ready() -> Any:
        _, snap = await a.call("GET", "/v1/runtime/snapshot")
        return snap if snap["models"] and snap["models"][0]["ready"] else None

    snap = await eventually(ready, "the engine to be ready", 60)
    for model in snap["models"]:
        aibrix_valid(aibrix.RuntimeSnapshotModel, model, MODEL_EXTENSIONS)
    parsed = aibrix.RuntimeSnapshotResponse.model_validate(
        {**snap, "models": [{k: v for k, v in m.items() if k not in MODEL_EXTENSIONS} for m in snap["models"]]}
    )
    (tiny,) = parsed.models
    assert tiny.alive and tiny.phase == "active" and tiny.port > 0 and tiny.last_transition is not None
    assert tiny.request_metrics_observed is False  # llama.cpp's server exports no metrics
    # Turnout's listen address (an extension: AIBrix's Go client, runtime_client.go, reads snapshots with
    # json.Unmarshal, which skips unknown fields) is where the engine really serves
    assert snap["models"][0]["listen_address"] == f"127.0.0.1:{tiny.port}"
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{snap['models'][0]['listen_address']}/v1/models") as r,
    ):
        assert r.status == 200
    status, listed = await a.call("GET", "/v1/runtime/models")
    for m in listed["models"]:
        aibrix.RuntimeModelInfo.model_validate(
            {k: v for k, v in m.items() if k in aibrix.RuntimeModelInfo.model_fields}
        )
    status, slept = await a.call(
        "POST", "/v1/runtime/models/sleep", {"model_name": "tiny", "level": 1, "operation_id": "s"}
    )
    assert status == 200 and aibrix_valid(aibrix.RuntimeOperationResponse, slept).phase == "sleeping"


@pytest.mark.parametrize("path", ["sleep", "wake", "kv-limit"])
async def test_operations_need_an_operation_id(mock_agent: Agent, path: str) -> None:
    await mock_agent.call("POST", "/v1/runtime/models/activate", {"model_name": "m", "artifact_url": "hf://o/m"})
    body = {"model_name": "m", "level": 1, "limit_bytes": 1}
    status, answer = await mock_agent.call("POST", f"/v1/runtime/models/{path}", body)
    assert status == 400 and "operation_id is required" in answer["error"]["message"]
    status, answer = await mock_agent.call("POST", f"/v1/runtime/models/{path}", {**body, "operation_id": ""})
    assert status == 400


async def test_nothing_to_do_is_not_applied(mock_agent: Agent) -> None:
    await mock_agent.call("POST", "/v1/runtime/models/activate", {"model_name": "m", "artifact_url": "hf://o/m"})
    status, body = await mock_agent.call("POST", "/v1/runtime/models/wake", {"model_name": "m", "operation_id": "w"})
    assert status == 200 and body["applied"] is False and body["phase"] == "active"  # awake already
    sleep = {"model_name": "m", "level": 1}
    assert (await mock_agent.call("POST", "/v1/runtime/models/sleep", {**sleep, "operation_id": "s1"}))[1]["applied"]
    status, body = await mock_agent.call("POST", "/v1/runtime/models/sleep", {**sleep, "operation_id": "s2"})
    assert status == 200 and body["applied"] is False and body["phase"] == "sleeping"


async def test_aibrix_activation_fields(mock_agent: Agent) -> None:
    """AIBrix's legacy ``additional_config`` engine flags become args; ``credentials`` are refused, saying where
    they belong instead."""
    body = {
        "model_name": "m",
        "artifact_url": "hf://o/m",
        "engine": "vllm",
        "ipc_name": None,
        "engine_config": {"args": {"--max-model-len": "2048"}},
        "additional_config": {"engine-arg:--enforce-eager": "", "unrelated": "x"},
    }
    assert (await mock_agent.call("POST", "/v1/runtime/models/activate", body))[0] == 200
    _, snap = await mock_agent.call("GET", "/v1/runtime/snapshot")
    assert snap["models"][0]["args"] == {"--max-model-len": "2048", "--enforce-eager": ""}
    status, answer = await mock_agent.call(
        "POST", "/v1/runtime/models/activate", {**body, "model_name": "n", "credentials": {"HF_TOKEN": "x"}}
    )
    assert status == 400 and "environment" in answer["error"]["message"]


CLAIM = """
kind: ModelClaim
metadata: {name: llama-claim}
spec:
  modelName: llama
  podSelector: {matchLabels: {pool: gpu}}
  artifactURL: huggingface://org/llama
  engine: vllm
"""


@pytest.fixture
async def aibrix_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[str, web.AppRunner]]:
    monkeypatch.setenv("AIBRIX_WEIGHT_CACHE_DIR", str(tmp_path / "aibrix-cache"))  # where its markers go
    low = free_port()
    url, runner = await serve_app(aibrix_runtime_app((low, low + 10)))
    yield url, runner
    await runner.cleanup()


async def test_turnout_controller_drives_aibrix_runtime(
    aibrix_runtime: tuple[str, web.AppRunner], tmp_path: Path
) -> None:
    url, runner = aibrix_runtime
    client = UpstreamClient(connect_timeout_s=2, total_timeout_s=10)
    try:
        pool = Pool("gpu-0", url, "127.0.0.1", 1, {"pool": "gpu", POOL_LABEL: "true"})
        ctl = LocalController(ClaimFiles(tmp_path / "data"), [pool], client)
        for doc in load_claim_documents(CLAIM):
            ctl.files.apply(doc)

        async def active() -> bool:
            await ctl.tick()
            return ctl.phase("llama-claim") is ClaimPhase.ACTIVE

        await eventually(active, "the claim to be Active on AIBrix's runtime", 10, every_s=0.05)
        assert runner.app[REFUSED] == []  # every request Turnout sent passed AIBrix's request models
        (inst,) = runner.app[AIBRIX_RUNTIME].list_models()
        assert inst.claim_ref["name"] == "llama-claim" and inst.claim_ref["namespace"] == "local"
        note = json.loads(ctl.annotations["gpu-0"]["modelclaim.aibrix.ai/llama-claim"])
        assert note == {"model": "llama", "port": inst.port, "state": "active"}
        # the AIBrix runtime's snapshot, read in Turnout's controller: its marker counts as cached
        assert ctl.reports["gpu-0"]["llama"]["restart_count"] == 0

        ctl.files.mark_deleted("llama-claim")

        async def gone() -> bool:
            await ctl.tick()
            return ctl.phase("llama-claim") is None

        await eventually(gone, "the claim to be released", 10, every_s=0.05)
        assert runner.app[AIBRIX_RUNTIME].list_models() == [] and runner.app[REFUSED] == []
    finally:
        await client.close()


def start_agent_process(port: int, tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with (tmp_path / "agent.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "turnout", "agent", "--port", str(port), "--registry", str(tmp_path / "e.json")],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )


async def test_turnout_gateway_wakes_a_sleeping_model_on_aibrix_runtime(
    aibrix_runtime: tuple[str, web.AppRunner], gateway: GatewayFactory
) -> None:
    """Put to sleep through AIBrix's own runtime API, then woken by a request to Turnout's gateway: the wake is
    a request AIBrix's WakeRuntimeModelRequest accepts, sent once."""
    url, runner = aibrix_runtime
    runtime = runner.app[AIBRIX_RUNTIME]
    gw, claims = await paused_gateway(gateway, url)
    for doc in load_claim_documents(CLAIM.replace("pool: gpu", "pool: cpu")):
        ClaimFiles(gw.settings.data_dir).apply(doc)
    await tick_until(claims, "llama", ClaimPhase.ACTIVE)
    assert runtime.sleep("llama", level=1, operation_id="aibrix-policy-1").applied
    await tick_until(claims, "llama", ClaimPhase.SLEEPING)

    answers = [await chat_code(gw, "llama") for _ in range(3)]
    assert {(s, h.get("Retry-After"), c) for s, h, c in answers} == {(503, "10", "model_waking")}
    await wake_tasks_done(claims)
    assert claims.wakes_sent == 1 and runner.app[REFUSED] == []
    assert [m.phase for m in runtime.list_models()] == ["active"]  # AIBrix's mock wakes at once
    await tick_until(claims, "llama", ClaimPhase.ACTIVE)


async def test_cli_agent_takes_aibrix_environment(tmp_path: Path) -> None:
    """``AIBRIX_MODEL_RUNTIME_MOCK=1`` and ``AIBRIX_WEIGHT_CACHE_DIR`` on a real ``turnout agent`` process."""
    port = free_port()
    cache = tmp_path / "weights"
    proc = start_agent_process(
        port, tmp_path, {"AIBRIX_MODEL_RUNTIME_MOCK": "1", "AIBRIX_WEIGHT_CACHE_DIR": str(cache)}
    )
    agent = Agent(f"http://127.0.0.1:{port}")

    async def up() -> Any:
        try:
            return (await agent.call("GET", "/healthz"))[1]
        except aiohttp.ClientError:
            return None

    try:
        health = await eventually(up, "the agent to answer", 30)
        assert health["mock"] is True
        status, body = await agent.call(
            "POST", "/v1/runtime/models/activate", {"model_name": "m", "artifact_url": "s3://bucket/m"}
        )
        assert status == 200 and body["phase"] == "active"  # no engine: ready at once
        _, snap = await agent.call("GET", "/v1/runtime/snapshot")
        assert snap["cached_artifacts"] == ["s3://bucket/m"]
        assert json.loads((cache / ".aibrix" / "served" / "m.json").read_text())["artifact_url"] == "s3://bucket/m"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert not (tmp_path / "e.json").exists()  # the mock persists nothing
