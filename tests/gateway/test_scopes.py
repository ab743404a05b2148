"""Key scopes follow the name rule routing uses: ``model:llama3.2`` is ``llama3.2:latest``, and a key's
``/v1/models`` and ``/api/tags`` list exactly the models it may call."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.conftest import EmulatorFactory, Gateway, GatewayFactory, create_key, worker

MODELS = ["llama3.2:latest", "llama3.2:1b", "qwen3:8b", "qwen3:latest", "org/m:latest"]


@pytest.fixture
async def locked(emulator: EmulatorFactory, gateway: GatewayFactory) -> Gateway:
    emu = await emulator("a", MODELS)
    return await gateway([worker("a", emu.url)], auth={"open": False})


def key(gw: Gateway, scopes: list[str]) -> str:
    return create_key(gw, scopes=scopes)[1]


async def request(gw: Gateway, method: str, path: str, k: str, body: Any = None) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, gw.url + path, json=body, headers={"Authorization": f"Bearer {k}"}) as r,
    ):
        return r.status, await r.json(content_type=None)


@pytest.mark.parametrize(
    ("scopes", "callable_"),
    [
        (["llama3.2"], {"llama3.2:latest"}),
        (["llama3.2:latest"], {"llama3.2:latest"}),
        (["llama3.2:*"], {"llama3.2:latest", "llama3.2:1b"}),
        (["qwen3", "org/m"], {"qwen3:latest", "org/m:latest"}),
        (["*"], set(MODELS)),
    ],
)
async def test_listing_is_exactly_what_the_key_may_call(
    locked: Gateway, scopes: list[str], callable_: set[str]
) -> None:
    k = key(locked, scopes)
    _, tags = await request(locked, "GET", "/api/tags", k)
    _, models = await request(locked, "GET", "/v1/models", k)
    assert {m["name"] for m in tags["models"]} == callable_
    assert {m["id"] for m in models["data"]} == callable_
    for name in MODELS:
        for spelling in {name, name.removesuffix(":latest")}:
            status, _ = await request(
                locked, "POST", "/api/chat", k, {"model": spelling, "messages": [], "stream": False}
            )
            assert (status == 200) is (name in callable_), (spelling, status)
            assert status in (200, 403)
