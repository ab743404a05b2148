"""Admin API for keys, usage and audit, end to end."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.conftest import EmulatorFactory, Gateway, GatewayFactory, worker


async def call(gw: Gateway, method: str, path: str, body: Any = None, key: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else gw.admin_headers
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{gw.url}{path}", json=body, headers=headers) as resp,
    ):
        return resp.status, await resp.json()


@pytest.fixture
async def gw(emulator: EmulatorFactory, gateway: GatewayFactory) -> Gateway:
    emu = await emulator("a", ["qwen3:8b"])
    return await gateway([worker("a", emu.url)], auth={"open": False})


CHAT = {"model": "qwen3:8b", "messages": [], "stream": False}


async def test_key_lifecycle(gw: Gateway) -> None:
    status, created = await call(
        gw, "POST", "/admin/api/keys", {"app": "web", "tenant": "team-a", "models": ["model:qwen3:*"], "rpm": 10}
    )
    assert status == 201 and created["key"].startswith("tk_")
    key, prefix = created["key"], created["record"]["prefix"]
    assert created["record"]["models"] == ["model:qwen3:*"] and created["record"]["tenant"] == "team-a"
    status, listing = await call(gw, "GET", "/admin/api/keys")
    assert [k["prefix"] for k in listing["keys"]] == [prefix]
    assert key not in str(listing)  # never shown again
    assert (await call(gw, "POST", "/v1/chat/completions", CHAT, key=key))[0] == 200

    status, rotated = await call(gw, "POST", f"/admin/api/keys/{prefix}/rotate", {"grace_s": 3600})
    assert status == 201 and rotated["key"] != key and rotated["old"]["expires_at"] is not None
    assert (await call(gw, "POST", "/v1/chat/completions", CHAT, key=key))[0] == 200  # grace period
    assert (await call(gw, "POST", "/v1/chat/completions", CHAT, key=rotated["key"]))[0] == 200

    status, revoked = await call(gw, "POST", f"/admin/api/keys/{prefix}/revoke")
    assert status == 200 and revoked["revoked_at"] is not None
    status, body = await call(gw, "POST", "/v1/chat/completions", CHAT, key=key)
    assert status == 401 and "revoked" in body["error"]["message"]  # at once, no cache lag

    _, audit = await call(gw, "GET", "/admin/api/audit")
    actions = [e["action"] for e in audit["entries"]]
    assert actions[:3] == ["key.revoke", "key.rotate", "key.create"] and "admin.signin" in actions
    revoke = audit["entries"][0]
    assert revoke["before"]["revoked_at"] is None and revoke["after"]["revoked_at"] is not None
    assert key not in str(audit)


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({}, 422, '"app" is required'),
        ({"app": "x", "models": ["model:q*x"]}, 422, "last character"),
        ({"app": "x", "rpm": 0}, 422, '"rpm" must be at least 1'),
        ({"app": "x", "expires": "someday"}, 422, "cannot read time"),
        ({"app": "x", "colour": "red"}, 422, "unknown field"),
    ],
)
async def test_bad_key_requests_write_nothing(gw: Gateway, body: dict[str, Any], status: int, fragment: str) -> None:
    got, reply = await call(gw, "POST", "/admin/api/keys", body)
    assert got == status and fragment in reply["error"]["message"]
    assert (await call(gw, "GET", "/admin/api/keys"))[1]["keys"] == []


async def test_unknown_key_is_404(gw: Gateway) -> None:
    status, body = await call(gw, "POST", "/admin/api/keys/tk_nothing/revoke")
    assert status == 404 and "no key" in body["error"]["message"]


async def test_usage_endpoint(gw: Gateway) -> None:
    _, created = await call(gw, "POST", "/admin/api/keys", {"app": "web"})
    for _ in range(2):
        await call(gw, "POST", "/api/chat", CHAT, key=created["key"])
    status, usage = await call(gw, "GET", f"/admin/api/usage?key={created['record']['prefix']}&bucket=day")
    assert status == 200 and usage["bucket"] == "day"
    [row] = usage["rows"]
    assert row["requests"] == 2 and row["completion_tokens"] == 10 and row["latency_ms_p95"] > 0
    assert (await call(gw, "GET", "/admin/api/usage?bucket=week"))[0] == 422


async def test_placement_changes_are_audited(gw: Gateway) -> None:
    await call(gw, "POST", "/admin/api/placement/workers/a/toggle", {"model": "qwen3:8b"})
    _, audit = await call(gw, "GET", "/admin/api/audit?action=placement.toggle")
    [entry] = audit["entries"]
    assert entry["target"] == "worker:a model:qwen3:8b"
    assert entry["before"]["source"] == "config" and entry["after"]["rules"]["denied_models"] == ["qwen3:8b"]


async def test_failed_admin_sign_in_is_audited(gw: Gateway) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{gw.url}/admin/api/keys", headers={"Authorization": "Bearer nope"}) as resp,
    ):
        assert resp.status == 401
    _, audit = await call(gw, "GET", "/admin/api/audit?action=admin.signin_failed")
    assert len(audit["entries"]) == 1
