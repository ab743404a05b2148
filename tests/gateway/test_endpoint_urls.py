"""Each endpoint's own URL (``/endpoints/<name>/v1``, ``/endpoints/<name>/api``): its models by their own
names, only its models listed, the key ``endpoint add`` printed, and every rule of the shared URL."""

from __future__ import annotations

from typing import Any

import aiohttp
import ollama
import openai
import orjson
import pytest

from tests.conftest import EmulatorFactory, Gateway, GatewayFactory, create_key, worker
from tests.gateway.test_endpoints import PRIVATE_OK, admin
from turnout.gateway.keys import ACCOUNTANT, USAGE


async def call(gw: Gateway, method: str, path: str, key: str | None = None, body: Any = None) -> tuple[int, Any, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{gw.url}{path}", json=body, headers=headers) as r,
    ):
        raw = await r.read()
        try:
            return r.status, orjson.loads(raw), r.headers
        except orjson.JSONDecodeError:
            return r.status, raw, r.headers


async def _setup(emulator: EmulatorFactory, gateway: GatewayFactory, **endpoint: Any) -> tuple[Gateway, Any, str]:
    """A locked gateway with a fleet worker (qwen3:8b) and the Ollama endpoint mac (qwen2.5:7b, llama3.2)."""
    fleet = await emulator("fleet", ["qwen3:8b"])
    mac = await emulator("mac", ["qwen2.5:7b", "llama3.2:latest"])
    gw = await gateway([worker("gpu", fleet.url)], env=PRIVATE_OK, auth={"open": False})
    status, reg = await admin(
        gw, "POST", "/admin/api/endpoints", {"name": "mac", "url": mac.url, "api": "ollama", **endpoint}
    )
    assert status == 201, reg
    return gw, mac, reg["key"]


def _chat(model: str, stream: bool = False) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}


async def test_the_printed_key_works_at_the_endpoints_own_url_with_its_own_names(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    gw, mac, key = await _setup(emulator, gateway)
    status, body, _ = await call(gw, "POST", "/endpoints/mac/api/chat", key, _chat("qwen2.5:7b"))
    assert status == 200 and "[mac]" in body["message"]["content"], body
    assert mac.calls[-1] == ("/api/chat", {**_chat("qwen2.5:7b")})  # its own name upstream, untouched
    status, body, _ = await call(gw, "POST", "/endpoints/mac/v1/chat/completions", key, _chat("llama3.2"))
    assert status == 200 and "[mac]" in body["choices"][0]["message"]["content"], body
    assert mac.calls[-1][1]["model"] == "llama3.2:latest"  # a tagless name means :latest, as on the shared URL
    # the official clients, pointed at the endpoint's own base URLs
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/endpoints/mac/v1", api_key=key, max_retries=0) as oa:
        answer = await oa.chat.completions.create(model="qwen2.5:7b", messages=[{"role": "user", "content": "hi"}])
        assert "[mac]" in (answer.choices[0].message.content or "")
        assert [m.id async for m in oa.models.list()] == ["llama3.2:latest", "qwen2.5:7b"]
    client = ollama.AsyncClient(host=f"{gw.url}/endpoints/mac", headers={"Authorization": f"Bearer {key}"})
    try:
        reply = await client.chat(model="qwen2.5:7b", messages=[{"role": "user", "content": "hi"}])
        assert "[mac]" in (reply.message.content or "")
        assert [m.model for m in (await client.list()).models] == ["llama3.2:latest", "qwen2.5:7b"]
    finally:
        await client.close()


async def test_listings_there_show_only_that_endpoints_models_by_their_own_names(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    gw, _, _ = await _setup(emulator, gateway)
    _, everything = create_key(gw)  # scope "*": sees the fleet's models too on the shared URL
    _, shared, _ = await call(gw, "GET", "/v1/models", everything)
    assert [m["id"] for m in shared["data"]] == ["mac/llama3.2:latest", "mac/qwen2.5:7b", "qwen3:8b"]
    _, own, _ = await call(gw, "GET", "/endpoints/mac/v1/models", everything)
    assert [m["id"] for m in own["data"]] == ["llama3.2:latest", "qwen2.5:7b"]
    _, tags, _ = await call(gw, "GET", "/endpoints/mac/api/tags", everything)
    assert [(m["name"], m["model"]) for m in tags["models"]] == [
        ("llama3.2:latest", "llama3.2:latest"),
        ("qwen2.5:7b", "qwen2.5:7b"),
    ]
    status, one, _ = await call(gw, "GET", "/endpoints/mac/v1/models/qwen2.5:7b", everything)
    assert status == 200 and one["id"] == "qwen2.5:7b"
    status, _, _ = await call(gw, "GET", "/endpoints/mac/v1/models/qwen3:8b", everything)
    assert status == 404  # a fleet model is not this endpoint's
    status, body, _ = await call(gw, "POST", "/endpoints/mac/api/chat", everything, _chat("qwen3:8b"))
    assert status == 404 and isinstance(body["error"], str)
    status, body, _ = await call(gw, "POST", "/endpoints/mac/api/show", everything, {"model": "qwen2.5:7b"})
    assert status == 200 and body["details"]["family"] == "qwen2.5"


async def test_the_endpoint_key_is_scoped_to_its_endpoint_on_either_url(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    gw, _, key = await _setup(emulator, gateway)
    other = await emulator("other", ["phi4:latest"])
    status, reg = await admin(gw, "POST", "/admin/api/endpoints", {"name": "other", "url": other.url, "api": "ollama"})
    assert status == 201
    status, body, _ = await call(gw, "POST", "/endpoints/other/v1/chat/completions", key, _chat("phi4"))
    assert status == 403 and body["error"]["code"] == "model_not_allowed"
    assert "other/phi4" in body["error"]["message"]  # the scope check sees the shared name
    _, listing, _ = await call(gw, "GET", "/endpoints/other/api/tags", key)
    assert listing == {"models": []}
    status, body, _ = await call(gw, "POST", "/endpoints/other/api/chat", reg["key"], _chat("phi4"))
    assert status == 200  # that endpoint's own key works there
    status, body, _ = await call(gw, "POST", "/endpoints/mac/api/chat", None, _chat("qwen2.5:7b"))
    assert status == 401 and body["error"].startswith("missing API key")
    status, body, _ = await call(gw, "POST", "/endpoints/mac/v1/chat/completions", "tk_wrong", _chat("qwen2.5:7b"))
    assert status == 401 and body["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    ("method", "path", "dialect"),
    [
        ("POST", "/endpoints/nope/v1/chat/completions", "openai"),
        ("GET", "/endpoints/nope/v1/models", "openai"),
        ("POST", "/endpoints/nope/api/chat", "ollama"),
        ("GET", "/endpoints/nope/api/tags", "ollama"),
        ("GET", "/endpoints/gpu/api/tags", "ollama"),  # a fleet worker is not an endpoint
        ("POST", "/endpoints/gpu/v1/chat/completions", "openai"),
    ],
)
async def test_an_unknown_endpoint_is_a_404_in_the_callers_dialect(
    emulator: EmulatorFactory, gateway: GatewayFactory, method: str, path: str, dialect: str
) -> None:
    gw, _, key = await _setup(emulator, gateway)
    status, body, _ = await call(gw, method, path, key, _chat("qwen2.5:7b") if method == "POST" else None)
    assert status == 404, body
    name = path.split("/")[2]
    if dialect == "ollama":
        assert f'no endpoint named "{name}"' in body["error"]
    else:
        assert body["error"]["code"] == "endpoint_not_found" and f'"{name}"' in body["error"]["message"]
    status, body, _ = await call(gw, "GET", "/endpoints/mac/api/nothing-here", key)
    assert status == 404 and isinstance(body["error"], str)  # an unknown route there: Ollama's dialect too


async def test_ollama_probes_answer_at_the_endpoints_own_url(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """Ollama clients probe "/" and /api/version of the base URL they are given."""
    gw, _, key = await _setup(emulator, gateway)
    status, body, _ = await call(gw, "GET", "/endpoints/mac/", key)
    assert status == 200 and body == b"Turnout is running"
    status, body, _ = await call(gw, "GET", "/endpoints/mac/api/version", key)
    assert status == 200 and "version" in body
    status, body, _ = await call(gw, "GET", "/endpoints/nope/api/version", key)
    assert status == 404 and 'no endpoint named "nope"' in body["error"]
    status, body, _ = await call(gw, "POST", "/endpoints/mac/api/pull", key, {"model": "x"})
    assert status == 403 and "engine administration" in body["error"]  # refused there too, never forwarded


async def test_limits_and_usage_are_the_shared_urls(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    gw, _, _ = await _setup(emulator, gateway)
    record, key = create_key(gw, scopes=["mac/*"], rpm=1)
    status, _, _ = await call(gw, "POST", "/endpoints/mac/api/chat", key, _chat("qwen2.5:7b"))
    assert status == 200
    status, body, _ = await call(gw, "POST", "/api/chat", key, _chat("mac/qwen2.5:7b"))
    assert status == 429, body  # one rate window for the key, whichever URL it uses
    status, body, headers = await call(gw, "POST", "/endpoints/mac/v1/chat/completions", key, _chat("qwen2.5:7b"))
    assert status == 429 and body["error"]["code"] == "rate_limit_exceeded" and "Retry-After" in headers
    await gw.app[ACCOUNTANT].usage.flush()
    rows = gw.app[USAGE].summary(since=0, key_id=record.id)
    assert {r["model"] for r in rows} == {"mac/qwen2.5:7b"}  # one model in usage, whichever URL was used
    assert sum(r["requests"] for r in rows) == 3


async def test_fallback_applies_at_the_endpoints_own_url(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    gw, mac, key = await _setup(emulator, gateway, fallback_model="qwen3:8b")
    mac.behaviour.fail_status = 500
    for path, model in (("/endpoints/mac/api/chat", "qwen2.5:7b"), ("/api/chat", "mac/qwen2.5:7b")):
        status, body, headers = await call(gw, "POST", path, key, _chat(model))
        assert status == 200 and "[fleet]" in body["message"]["content"], (path, body)
        assert headers["X-Fallback-From"] == "mac/qwen2.5:7b"
    await gw.app[ACCOUNTANT].usage.flush()
    rows = gw.app[USAGE].summary(since=0)
    assert [(r["model"], r["fallback_from"], r["requests"]) for r in rows] == [("mac/qwen2.5:7b", "mac/qwen2.5:7b", 2)]


async def test_registration_answer_names_both_urls(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    mac = await emulator("mac", ["qwen2.5:7b"])
    gw = await gateway([], env=PRIVATE_OK)
    _, reg = await admin(gw, "POST", "/admin/api/endpoints", {"name": "mac", "url": mac.url, "api": "ollama"})
    assert reg["urls"] == {
        "openai": f"{gw.url}/endpoints/mac/v1",
        "ollama": f"{gw.url}/endpoints/mac",
        "shared_openai": f"{gw.url}/v1",
        "shared_ollama": gw.url,
    }


async def test_an_unknown_model_with_only_endpoints_is_a_404_not_an_empty_fleet(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """A gateway whose models all come from endpoints (or claims: the quick start's demo model) has no worker for
    un-namespaced names: an unknown one is a 404 ``model_not_found``, not a 503 saying nothing is configured (which
    sent a batch line to wait for its window)."""
    mac = await emulator("mac", ["qwen2.5:7b"])
    gw = await gateway([], env=PRIVATE_OK)
    assert (await admin(gw, "POST", "/admin/api/endpoints", {"name": "mac", "url": mac.url, "api": "ollama"}))[0] == 201
    body = {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}
    status, answer, _ = await call(gw, "POST", "/v1/chat/completions", body=body)
    assert status == 404 and answer["error"]["code"] == "model_not_found", answer
    assert "nope" in answer["error"]["message"]
    status, _, _ = await call(gw, "POST", "/v1/chat/completions", body={**body, "model": "mac/qwen2.5:7b"})
    assert status == 200
