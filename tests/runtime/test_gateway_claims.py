"""Gateway + in-process local controller + real agent + real llama.cpp: routing by claim phase."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from tests.conftest import Gateway, GatewayFactory, eventually
from tests.runtime.conftest import AgentStarter
from tests.support.claims import claim_yaml
from turnout.controller.local import ClaimFiles, load_claim_documents
from turnout.runtime.agent import SUPERVISOR


async def chat(gw: Gateway, model: str) -> tuple[int, dict[str, str]]:
    status, headers, _ = await chat_code(gw, model)
    return status, headers


async def chat_code(gw: Gateway, model: str, hold: bool = False) -> tuple[int, dict[str, str], str | None]:
    """Status, headers and the error code (None on success). Not ``hold``: the client asks not to be held
    (X-Turnout-Hold: 0) and gets the claim's own answer at once, as every client did before holds."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {} if hold else {"X-Turnout-Hold": "0"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers) as r,
    ):
        data = await r.json(content_type=None)
        code = data["error"]["code"] if r.status >= 400 else None
        return r.status, dict(r.headers), code


CLAIM_503 = {"model_waking": "10", "model_activating": "10"}  # the claim's own answers and their Retry-After


async def through_the_transition(gw: Gateway, model: str, limit_s: float = 60) -> list[tuple[int, str | None]]:
    """Ask for ``model`` without pause from now until it answers 200 again after at least one 503, and
    check every answer on the way: 200, or the claim's own 503 with its short Retry-After; never the
    generic no-route 503 (whose Retry-After would be the gateway's health interval)."""
    seen: list[tuple[int, str | None]] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        status, headers, code = await chat_code(gw, model)
        seen.append((status, code))
        if status == 503:
            assert code in CLAIM_503, (code, seen)
            assert headers["Retry-After"] == CLAIM_503[code], (headers.get("Retry-After"), seen)
        else:
            assert status == 200, (status, code, seen)
            if any(s == 503 for s, _ in seen):
                return seen
    raise AssertionError(f"{model} did not come back within {limit_s}s: {seen[-5:]}")


async def until_status(gw: Gateway, model: str, status: int, limit_s: float = 60) -> dict[str, str]:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        got, headers = await chat(gw, model)
        if got == status:
            return headers
        await asyncio.sleep(0.2)
    raise AssertionError(f"{model} never answered {status}")


async def test_claims_route_sleep_wake_and_fail(
    start_agent: AgentStarter, gateway: GatewayFactory, tiny_model: Path, tmp_path: Path
) -> None:
    url, agent = await start_agent()
    gw = await gateway(
        [],
        pools={
            "agents": [
                {"name": "cpu-0", "agent_url": url, "labels": {"pool": "cpu", "pool.aibrix.ai/enabled": "true"}}
            ],
            "interval_s": 0.2,
        },
    )
    files = ClaimFiles(gw.settings.data_dir)
    for name, model in (("alpha", tiny_model), ("broken", tmp_path / "missing.gguf")):
        for doc in load_claim_documents(claim_yaml(name, model)):
            files.apply(doc)
    # within a tick the claim is known: 503 with Retry-After while it activates, then the engine is routable
    deadline = time.monotonic() + 5
    status, headers = await chat(gw, "alpha")
    while status != 200 and "Retry-After" not in headers and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        status, headers = await chat(gw, "alpha")
    assert status == 200 or headers["Retry-After"] == "10"
    await until_status(gw, "alpha", 200)
    async with aiohttp.ClientSession() as http, http.get(f"{gw.url}/v1/models") as r:
        assert "alpha" in [m["id"] for m in (await r.json())["data"]]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gw.url}/admin/api/claims") as r:
            assert r.status == 401  # admin token required
        async with http.get(f"{gw.url}/admin/api/claims", headers=gw.admin_headers) as r:
            listed = {c["claim"]: c for c in (await r.json())["claims"]}
    assert listed["alpha"]["phase"] == "Active" and listed["alpha"]["serving"] is True
    assert listed["alpha"]["upstream"].startswith("127.0.0.1:")

    # the engine goes to sleep: requests get 503 Retry-After: 10 and exactly one wake happens
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{url}/v1/runtime/models/sleep", json={"model_name": "alpha", "level": 1, "operation_id": "test-sleep"}
        ) as r,
    ):
        assert r.status == 200
    seen = await through_the_transition(gw, "alpha")  # every answer from de-route to re-route checked
    assert "model_waking" in {c for _, c in seen}
    results = await asyncio.gather(*(chat(gw, "alpha") for _ in range(10)))
    assert all(s == 200 for s, _ in results)
    # the engine is routable as soon as it is ready, a moment before the agent's wake handler counts its
    # answer: wait for the count, then check that it is exactly one
    wakes = 'aibrix:modelclaim_lifecycle_operations_total{operation="wake",result="ok"} '

    async def wake_count() -> str | None:
        async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as r:
            text = await r.text()
        found = [line[len(wakes) :] for line in text.splitlines() if line.startswith(wakes)]
        return found[0] if found else None

    assert await eventually(wake_count, "the agent counted the wake", limit_s=10, every_s=0.05) == "1.0"
    await asyncio.sleep(0.5)  # no second wake arrives late
    assert await wake_count() == "1.0"

    # a claim whose engine keeps crashing ends Failed: 503 without Retry-After
    headers = await until_status(gw, "broken", 503)
    deadline = time.monotonic() + 60
    while "Retry-After" in headers and time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        _, headers = await chat(gw, "broken")
    assert "Retry-After" not in headers
    assert agent.app[SUPERVISOR].engines["broken"].phase == "failed"


async def test_a_claim_no_pool_takes_is_scheduling_unlisted_and_answered_activating(
    start_agent: AgentStarter, gateway: GatewayFactory, tiny_model: Path
) -> None:
    """A claim with zero candidate pods remains Scheduling with no pod: the gateway answers it as one on its way
    up (503 model_activating, Retry-After: 10) and does not list it (nothing runs it anywhere)."""
    url, _ = await start_agent()
    labels = {"pool": "cpu", "pool.aibrix.ai/enabled": "true"}
    gw = await gateway([], pools={"agents": [{"name": "cpu-0", "agent_url": url, "labels": labels}], "interval_s": 0.1})
    files = ClaimFiles(gw.settings.data_dir)
    for doc in load_claim_documents(claim_yaml("nowhere", tiny_model).replace("pool: cpu", "pool: gpu")):
        files.apply(doc)

    async def scheduling() -> tuple[int, dict[str, str], str | None] | None:
        answer = await chat_code(gw, "nowhere")
        return answer if answer[2] == "model_activating" else None

    status, headers, _ = await eventually(scheduling, "the claim's own activating answer", every_s=0.05)
    assert status == 503 and headers["Retry-After"] == "10"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gw.url}/admin/api/claims", headers=gw.admin_headers) as r:
            [claim] = (await r.json())["claims"]
        async with http.get(f"{gw.url}/v1/models") as r:
            listed = [m["id"] for m in (await r.json())["data"]]
    assert claim["claim"] == "nowhere" and claim["phase"] == "Scheduling" and claim["upstream"] is None
    assert "nowhere" not in listed
