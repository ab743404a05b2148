"""Client auth, key scopes and exact limits through the gateway (keys made with the real store)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from tests.conftest import Clients, EmulatorFactory, Gateway, GatewayFactory, create_key, worker
from turnout.gateway.keys import ACCOUNTANT, KEYS, USAGE
from turnout.store.usage import UsageStore


def make_key(gw: Gateway, **kw: Any) -> str:
    return create_key(gw, **kw)[1]


async def post(gw: Gateway, path: str, body: dict[str, Any], key: str | None) -> tuple[int, Any, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http, http.post(f"{gw.url}{path}", json=body, headers=headers) as r:
        return r.status, await r.json(content_type=None), r.headers


@pytest.fixture
async def locked(emulator: EmulatorFactory, gateway: GatewayFactory) -> Gateway:
    emu = await emulator("a", ["qwen3:8b", "llama3.2:latest"], token_delay_s=0.0)
    return await gateway([worker("a", emu.url)], auth={"open": False})


CHAT = {"model": "qwen3:8b", "messages": [], "stream": False}


@pytest.mark.parametrize(
    ("path", "header", "fragment"),
    [
        ("/v1/chat/completions", None, "missing API key"),
        ("/v1/chat/completions", "Bearer tk_nope", "invalid API key"),
        ("/v1/chat/completions", "Basic abc", "must be 'Bearer <key>'"),
        ("/api/chat", None, "missing API key"),
        ("/api/tags", None, "missing API key"),
        ("/v1/models", "Bearer wrong", "invalid API key"),
    ],
)
async def test_auth_required(locked: Gateway, path: str, header: str | None, fragment: str) -> None:
    headers = {"Authorization": header} if header else {}
    method = "GET" if path in ("/api/tags", "/v1/models") else "POST"
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{locked.url}{path}", json=CHAT, headers=headers) as resp,
    ):
        body = await resp.json()
    assert resp.status == 401
    message = body["error"] if path.startswith("/api") else body["error"]["message"]
    assert fragment in message


async def test_scopes_limit_models_and_discovery(locked: Gateway, clients: Clients) -> None:
    key = make_key(locked, scopes=["qwen3:*"])
    status, _, _ = await post(locked, "/v1/chat/completions", CHAT, key)
    assert status == 200
    status, body, _ = await post(locked, "/api/chat", {**CHAT, "model": "llama3.2"}, key)
    assert status == 403 and "not allowed for this API key (scopes: model:qwen3:*)" in body["error"]
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
        async with http.get(f"{locked.url}/v1/models") as r:
            assert [m["id"] for m in (await r.json())["data"]] == ["qwen3:8b"]
        async with http.get(f"{locked.url}/api/tags") as r:
            assert [m["name"] for m in (await r.json())["models"]] == ["qwen3:8b"]
        async with http.get(f"{locked.url}/v1/models/llama3.2:latest") as r:
            assert r.status == 404
    full = make_key(locked)
    client = clients.openai(locked.url)
    client.api_key = full
    assert {m.id for m in (await client.models.list()).data} == {"qwen3:8b", "llama3.2:latest"}


async def test_revoked_and_expired_keys(locked: Gateway) -> None:
    key = make_key(locked)
    assert (await post(locked, "/v1/chat/completions", CHAT, key))[0] == 200
    locked.app[KEYS].revoke(key[:10], now=time.time())
    locked.app[ACCOUNTANT].forget()  # what the admin API does after a revoke
    status, body, _ = await post(locked, "/v1/chat/completions", CHAT, key)
    assert status == 401 and "revoked" in body["error"]["message"]
    expired = make_key(locked, expires_at=time.time() - 1)
    status, body, _ = await post(locked, "/v1/chat/completions", CHAT, expired)
    assert status == 401 and "expired" in body["error"]["message"]


async def test_rpm_is_exact_under_concurrency(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["qwen3:8b"], token_delay_s=0.002)
    gw = await gateway([worker("a", emu.url)], auth={"open": False})
    key = make_key(gw, rpm=50)
    async with aiohttp.ClientSession(
        headers={"Authorization": f"Bearer {key}"}, connector=aiohttp.TCPConnector(limit=0)
    ) as http:

        async def one() -> tuple[int, dict[str, str]]:
            async with http.post(f"{gw.url}/v1/chat/completions", json=CHAT) as r:
                await r.read()
                return r.status, dict(r.headers)

        results = await asyncio.gather(*(one() for _ in range(200)))
    statuses = [s for s, _ in results]
    assert statuses.count(200) == 50 and statuses.count(429) == 150
    refused = next(h for s, h in results if s == 429)
    assert int(refused["Retry-After"]) >= 1
    assert refused["x-ratelimit-limit-requests"] == "50" and refused["x-ratelimit-remaining-requests"] == "0"
    assert emu.served("/v1/chat/completions") == 50


async def test_daily_tokens_reserve_settle_and_429(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["qwen3:8b"], tokens=5)
    gw = await gateway([worker("a", emu.url)], auth={"open": False, "default_completion_tokens": 50})
    key = make_key(gw, daily_tokens=200)
    # each call reserves ~(body/4 + max_tokens) and settles at the real 7 prompt + 5 completion tokens
    for _ in range(5):
        status, _, _ = await post(gw, "/api/chat", {**CHAT, "options": {"num_predict": 100}}, key)
        assert status == 200
    status, body, headers = await post(gw, "/api/chat", {**CHAT, "options": {"num_predict": 150}}, key)
    assert status == 429 and "daily token limit of 200" in body["error"]
    assert headers["x-ratelimit-limit-tokens"] == "200" and int(headers["Retry-After"]) > 0
    assert int(headers["x-ratelimit-remaining-tokens"]) == 200 - 5 * 12


async def test_failed_upstream_refunds(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["qwen3:8b"], fail_status=500)
    gw = await gateway([worker("a", emu.url)], auth={"open": False})
    key = make_key(gw, daily_tokens=300)
    for _ in range(5):  # each would reserve ~276 tokens; refunds keep the budget whole
        assert (await post(gw, "/v1/chat/completions", CHAT, key))[0] == 502  # a worker's 500 is a bad gateway


async def test_usage_rows_are_written(locked: Gateway) -> None:
    key = make_key(locked)
    for _ in range(3):
        await post(locked, "/api/chat", CHAT, key)
    await post(locked, "/api/chat", {**CHAT, "model": "nope"}, key)
    await locked.app[ACCOUNTANT].usage.flush()
    rows = locked.app[USAGE].summary(since=0)
    ok = next(r for r in rows if r["model"] == "qwen3:8b")
    assert ok["requests"] == 3 and ok["prompt_tokens"] == 21 and ok["completion_tokens"] == 15
    assert ok["worker"] == "a" and ok["key"] == key[:10] and ok["endpoint"] == "ollama:chat"
    bad = next(r for r in rows if r["model"] == "nope")
    assert bad["errors"] == 1 and bad["worker"] is None


async def test_open_access_ignores_placeholder_keys(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["qwen3:8b"])
    gw = await gateway([worker("a", emu.url)])
    assert (await post(gw, "/v1/chat/completions", CHAT, "sk-whatever"))[0] == 200
    scoped = make_key(gw, scopes=["llama*"])
    assert (await post(gw, "/v1/chat/completions", CHAT, scoped))[0] == 403  # a real key keeps its scopes


async def test_shutdown_flushes_usage(locked: Gateway) -> None:
    key = make_key(locked)
    for _ in range(3):
        await post(locked, "/api/chat", CHAT, key)
    store = locked.app[USAGE]
    await locked.stop()  # no explicit flush: shutdown must write the pending batch
    reopened = type(store.db)(store.db.url)
    try:
        rows = UsageStore(reopened).summary(since=0)
    finally:
        reopened.close()
    assert sum(r["requests"] for r in rows) == 3


async def test_client_disconnect_refunds_the_reservation(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["qwen3:8b"], tokens=200, token_delay_s=0.02)
    gw = await gateway([worker("a", emu.url)], auth={"open": False, "default_completion_tokens": 900})
    key = make_key(gw, daily_tokens=1000)  # room for exactly one reservation of ~920 at a time
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
        resp = await http.post(f"{gw.url}/api/chat", json={**CHAT, "stream": True})
        await resp.content.readline()
        refused = await post(gw, "/api/chat", CHAT, key)
        assert refused[0] == 429  # the open stream holds the reservation
        resp.close()  # the client hangs up mid-stream
    for _ in range(200):
        if emu.cancelled:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    emu.behaviour.tokens = 3
    status, _, _ = await post(gw, "/api/chat", CHAT, key)
    assert status == 200  # refunded: the budget is whole again


async def test_tenant_limits_span_its_keys(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["qwen3:8b"])
    gw = await gateway([worker("a", emu.url)], auth={"open": False}, tenants={"team-a": {"rpm": 3}})
    one = make_key(gw, app="a1", tenant="team-a", rpm=2)
    two = make_key(gw, app="a2", tenant="team-a")
    other = make_key(gw, app="b1", tenant="team-b")
    statuses = [(await post(gw, "/api/chat", CHAT, k))[0] for k in (one, one, one, two, two)]
    # one: 2 allowed by its own limit, third refused by the key (not charged to the tenant);
    # two: one more fits the tenant's 3, then the tenant limit refuses
    assert statuses == [200, 200, 429, 200, 429]
    status, body, _ = await post(gw, "/api/chat", CHAT, two)
    assert status == 429 and body["error"].startswith('tenant "team-a": rate limit of 3')
    assert (await post(gw, "/api/chat", CHAT, other))[0] == 200
