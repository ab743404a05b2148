"""What listings tell real clients: a stable, distinct ``digest`` per model (llm-ollama groups by it), a real
``modified_at`` (not the time of the request), and ``/api/ps`` for OpenAI-style workers. Against the real
llama.cpp engine and the Ollama emulator (also serving as an OpenAI-style worker through its ``/v1``)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import aiohttp

from tests.conftest import EmulatorFactory, Engine, Gateway, GatewayFactory, worker
from tests.gateway.test_endpoints import PRIVATE_OK, admin
from turnout.gateway.keys import POLLER

HEX64 = re.compile(r"[0-9a-f]{64}")


async def get(gw: Gateway, path: str) -> Any:
    async with aiohttp.ClientSession() as http, http.get(f"{gw.url}{path}") as r:
        assert r.status == 200, await r.text()
        return await r.json()


def by_name(listing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in listing["models"]}


async def test_every_model_has_a_stable_distinct_digest(
    llama_engine: Engine, emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """Two OpenAI-style workers' models used to share the digest "" (and became one model in llm-ollama)."""
    lmstudio = await emulator("lmstudio", ["qwen3:8b"])  # an OpenAI-style server (its /v1 routes)
    ollama_box = await emulator("ollamabox", ["llama3.2:latest"])
    mac = await emulator("mac", ["llama3.2:latest"])  # the same model as the fleet's, on an endpoint
    gw = await gateway(
        [
            worker("llama", llama_engine.url, type="openai"),
            worker("lms", lmstudio.url, type="openai"),
            worker("box", ollama_box.url),
        ],
        env=PRIVATE_OK,
    )
    await admin(gw, "POST", "/admin/api/endpoints", {"name": "mac", "url": mac.url, "api": "ollama"})
    tags = by_name(await get(gw, "/api/tags"))
    assert sorted(tags) == ["llama3.2:latest", "mac/llama3.2:latest", "qwen3:8b", "tiny"]
    digests = {name: m["digest"] for name, m in tags.items()}
    assert all(HEX64.fullmatch(d) for d in digests.values()), digests
    assert len(set(digests.values())) == 4, digests  # no two names share one: none is merged into another
    real = hashlib.sha256(b"llama3.2:latest").hexdigest()  # what the emulated Ollama reports
    assert digests["llama3.2:latest"] == real  # an Ollama worker's own digest is kept
    own = by_name(await get(gw, "/endpoints/mac/api/tags"))
    assert own["llama3.2:latest"]["digest"] == real  # on the endpoint's own URL: its real digest
    await gw.app[POLLER].poll_all()  # a new inventory round changes nothing
    assert {name: m["digest"] for name, m in by_name(await get(gw, "/api/tags")).items()} == digests
    ps = by_name(await get(gw, "/api/ps"))
    assert ps["tiny"]["digest"] == digests["tiny"] and ps["qwen3:8b"]["digest"] == digests["qwen3:8b"]


async def test_modified_at_is_the_models_not_the_requests(
    llama_engine: Engine, emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """llama.cpp reports no ``created``: the time the gateway first listed the model, kept. An OpenAI-style
    server that reports one (here Ollama's /v1, the model's modification time) keeps it; so does Ollama's own."""
    lmstudio = await emulator("lmstudio", ["qwen3:8b"])
    box = await emulator("box", ["llama3.2:latest"])
    gw = await gateway(
        [
            worker("llama", llama_engine.url, type="openai"),
            worker("lms", lmstudio.url, type="openai"),
            worker("box", box.url),
        ]
    )
    first = by_name(await get(gw, "/api/tags"))
    await get(gw, "/v1/models")
    second = by_name(await get(gw, "/api/tags"))
    assert second["tiny"]["modified_at"] == first["tiny"]["modified_at"]
    assert second["qwen3:8b"]["modified_at"] == "2023-11-14T22:13:20Z"  # the worker's created: 1700000000
    assert second["llama3.2:latest"]["modified_at"] == "2025-05-01T10:00:00.000000+00:00"  # Ollama's own
    async with aiohttp.ClientSession() as http, http.post(f"{gw.url}/api/show", json={"model": "tiny"}) as r:
        assert (await r.json())["modified_at"] == first["tiny"]["modified_at"]  # /api/show agrees with /api/tags
    models = {m["id"]: m for m in (await get(gw, "/v1/models"))["data"]}
    assert models["qwen3:8b"]["created"] == 1700000000


async def test_modified_at_is_the_same_in_every_process_and_after_a_restart(
    llama_engine: Engine, gateway: GatewayFactory, tmp_path: Path
) -> None:
    """The first listing of a model that reports no time is kept in the store: two gateways on one database
    (the processes of `serve --workers 2`, or replicas) and a gateway started later give the same time."""
    shared = {"database_url": f"sqlite:///{tmp_path / 'shared.db'}"}
    fleet = [worker("llama", llama_engine.url, type="openai")]
    a = await gateway(fleet, storage={**shared, "data_dir": str(tmp_path / "a")})
    first = by_name(await get(a, "/api/tags"))["tiny"]["modified_at"]
    b = await gateway(fleet, storage={**shared, "data_dir": str(tmp_path / "b")})  # b lists it only now
    assert by_name(await get(b, "/api/tags"))["tiny"]["modified_at"] == first
    c = await gateway(fleet, storage={**shared, "data_dir": str(tmp_path / "c")})  # a later start
    assert by_name(await get(c, "/api/tags"))["tiny"]["modified_at"] == first
    async with aiohttp.ClientSession() as http, http.post(f"{c.url}/api/show", json={"model": "tiny"}) as r:
        assert (await r.json())["modified_at"] == first


async def test_ps_lists_the_models_of_openai_style_workers(
    llama_engine: Engine, emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    box = await emulator("box", ["llama3.2:latest", "qwen3:8b"], loaded=["qwen3:8b"])
    gw = await gateway([worker("llama", llama_engine.url, type="openai"), worker("box", box.url)])
    ps = by_name(await get(gw, "/api/ps"))
    assert sorted(ps) == ["qwen3:8b", "tiny"]  # the Ollama worker's own residency; every OpenAI-style model
    tiny = ps["tiny"]
    assert tiny["model"] == "tiny" and tiny["expires_at"] == "2318-01-01T00:00:00Z"  # Ollama's CLI: "Forever"
    assert set(tiny) >= {"size", "size_vram", "details", "context_length"}
