"""State for the screenshots of the operator pages (Endpoints, Keys, Usage, Audit, Runtime pools, Persistence),
used by ``scripts/screenshots.py``.

- :func:`start_pool`: a real runtime agent (no GPU needed) for a ``pools`` section, and a tiny GGUF model that
  real llama.cpp runs, so the Runtime pools page shows an Active claim next to one that keeps failing.
- :func:`seed_operator_pages`: endpoints (one online, one not answering), keys in every state (active, in grace
  after a rotation, revoked), traffic through a key and an endpoint, and the claims.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from tests.conftest import free_port, serve_app
from tests.support.claims import claim_yaml
from tests.support.ollama_emulator import Behaviour, OllamaEmulator
from tests.support.tiny_gguf import write_tiny_model

from turnout.controller.local import ClaimFiles, load_claim_documents
from turnout.runtime.agent import SUPERVISOR, create_agent_app

__all__ = ["seed_operator_pages", "start_pool"]


async def start_pool(tmp: Path) -> tuple[dict[str, Any], Callable[[], Awaitable[None]]]:
    """A ``pools`` config section with one real agent, and the coroutine that stops it and its engines."""
    low = free_port()
    app = create_agent_app(
        registry_path=tmp / "agent" / "engines.json",
        log_dir=tmp / "agent" / "logs",
        port_range=(low, low + 20),
        backoff_base_s=0.05,
    )
    url, runner = await serve_app(app)

    async def stop() -> None:
        await runner.app[SUPERVISOR].stop_all()
        await runner.cleanup()

    labels = {"pool": "cpu", "pool.aibrix.ai/enabled": "true"}
    return {"agents": [{"name": "cpu-pod-0", "agent_url": url, "labels": labels}], "interval_s": 0.5}, stop


async def seed_operator_pages(url: str, token: str, data_dir: Path, tmp: Path) -> list[OllamaEmulator]:
    """Returns the emulators it started (the caller stops them)."""
    admin = {"Authorization": f"Bearer {token}"}
    mac = OllamaEmulator("mac-mini", Behaviour(models=["llama3.2:latest", "gemma3:4b"], tokens=6))
    await mac.start()
    files = ClaimFiles(data_dir)
    model = write_tiny_model(tmp / "tiny.gguf")
    for name, artifact in (("tiny-chat", model), ("broken-model", tmp / "missing.gguf")):
        for doc in load_claim_documents(claim_yaml(name, artifact)):
            files.apply(doc)
    async with aiohttp.ClientSession(headers=admin) as http:
        for body in (
            {
                "name": "mac-mini",
                "url": mac.url,
                "api": "ollama",
                "fallback_model": "qwen3:8b",
                "latency_budget_ms": 900,
            },
            {"name": "studio-lms", "url": f"http://127.0.0.1:{free_port()}", "api": "openai"},
        ):
            async with http.post(f"{url}/admin/api/endpoints", json=body) as r:
                r.raise_for_status()
        made = {}
        for body in (
            {
                "app": "support-bot",
                "tenant": "customer-care",
                "models": ["llama3.2", "mac-mini/*"],
                "rpm": 120,
                "priority": "interactive",
            },
            {"app": "batch-jobs", "tenant": "research", "daily_tokens": 2_000_000, "expires": "90d"},
            {"app": "old-prototype", "tenant": "research"},
        ):
            async with http.post(f"{url}/admin/api/keys", json=body) as r:
                made[body["app"]] = (await r.json())["record"]["prefix"]
        async with http.post(f"{url}/admin/api/keys/{made['batch-jobs']}/rotate", json={"grace_s": 86_400}) as r:
            r.raise_for_status()
        async with http.patch(f"{url}/admin/api/keys/{made['support-bot']}", json={"rpm": 240}) as r:
            r.raise_for_status()
        async with http.post(f"{url}/admin/api/keys/{made['old-prototype']}/revoke") as r:
            r.raise_for_status()
        async with http.patch(f"{url}/admin/api/tenants/research", json={"priority": "batch"}) as r:
            r.raise_for_status()  # the research tenant's keys: batch, unless a key says otherwise
        async with http.post(f"{url}/admin/api/keys", json={"app": "support-bot"}) as r:
            key = (await r.json())["key"]
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
        for i in range(18):
            model = ("mac-mini/llama3.2", "qwen3:8b", "mac-mini/gemma3:4b")[i % 3]
            body = {"model": model, "messages": [{"role": "user", "content": f"hi {i}"}], "stream": False}
            async with http.post(f"{url}/v1/chat/completions", json=body) as r:
                await r.read()
    async with aiohttp.ClientSession(headers=admin) as http:  # until the claims settle (Active / Failed)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            async with http.get(f"{url}/admin/api/claims") as r:
                phases = {c["claim"]: c["phase"] for c in (await r.json())["claims"]}
            if phases.get("tiny-chat") == "Active" and phases.get("broken-model") == "Failed":
                break
            await asyncio.sleep(0.5)
    return [mac]
