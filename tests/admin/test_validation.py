"""Every admin JSON API input is range-checked end to end: a bad field is 422 naming it, and nothing is stored.

"Nothing" is checked where it would land: keys (and the apps and tenants they create), endpoints, the
placement override file, and the audit log (no entry claiming the change).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from tests.conftest import EmulatorFactory, Gateway, GatewayFactory, worker
from turnout.gateway.keys import KEYS

HUGE = 2**63
INT32_OVER = 2**31


async def call(gw: Gateway, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    headers = {**gw.admin_headers, "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{gw.url}{path}", data=data, headers=headers) as r,
    ):
        return r.status, await r.json()


@pytest.fixture
async def gw(emulator: EmulatorFactory, gateway: GatewayFactory) -> Gateway:
    emu = await emulator("a", ["qwen3:8b"])
    return await gateway([worker("a", emu.url)], auth={"open": False})


async def audit_actions(gw: Gateway) -> list[str]:
    _, body = await call(gw, "GET", "/admin/api/audit?limit=1000")
    return [e["action"] for e in body["entries"] if not e["action"].startswith("admin.")]


def assert_422(status: int, body: Any, field: str) -> None:
    assert status == 422, body
    error = body["error"]
    assert error["code"] == "invalid_field" and error["type"] == "invalid_request_error", error
    assert f'"{field}' in error["message"], error["message"]


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("app", {}),
        ("app", {"app": 7}),
        ("app", {"app": "web\n"}),
        ("app", {"app": "w" * 129}),
        ("tenant", {"app": "web", "tenant": "t\x00"}),
        ("tenant", {"app": "web", "tenant": "t" * 129}),
        ("rpm", {"app": "web", "rpm": HUGE}),
        ("rpm", {"app": "web", "rpm": INT32_OVER}),
        ("rpm", {"app": "web", "rpm": 0}),
        ("rpm", {"app": "web", "rpm": -3}),
        ("rpm", {"app": "web", "rpm": True}),
        ("rpm", {"app": "web", "rpm": 2.5}),
        ("rpm", {"app": "web", "rpm": "60"}),
        ("daily_tokens", {"app": "web", "daily_tokens": HUGE}),
        ("daily_tokens", {"app": "web", "daily_tokens": "nan"}),
        ("expires", {"app": "web", "expires": "nan"}),
        ("expires", {"app": "web", "expires": "inf"}),
        ("expires", {"app": "web", "expires": "-inf"}),
        ("expires", {"app": "web", "expires": "1e999"}),
        ("expires", {"app": "web", "expires": 1e300}),
        ("expires", {"app": "web", "expires": -1}),
        ("expires", {"app": "web", "expires": "99999999d"}),
        ("expires", {"app": "web", "expires": "0001-01-01T00:00:00+01:00"}),
        ("expires", {"app": "web", "expires": True}),
        ("expires", {"app": "web", "expires": {"days": 3}}),
        ("models", {"app": "web", "models": "model:*"}),
        ("models[0]", {"app": "web", "models": ["model:q\x00"]}),
        ("models[0]", {"app": "web", "models": ["m" * 300]}),
        ("models[1]", {"app": "web", "models": ["ok", 3]}),
        ("models", {"app": "web", "models": ["m"] * 101}),
        ("colour", {"app": "web", "colour": "red"}),
    ],
)
async def test_bad_key_create(gw: Gateway, field: str, body: dict[str, Any]) -> None:
    assert_422(*await call(gw, "POST", "/admin/api/keys", body), field)
    assert (await call(gw, "GET", "/admin/api/keys"))[1]["keys"] == []
    assert await audit_actions(gw) == []
    assert gw.app[KEYS].count() == 0


async def test_limits_at_the_bounds_are_stored(gw: Gateway) -> None:
    body = {"app": "web", "rpm": INT32_OVER - 1, "daily_tokens": INT32_OVER - 1, "expires": "3650d"}
    status, created = await call(gw, "POST", "/admin/api/keys", body)
    assert status == 201, created
    assert created["record"]["rpm"] == INT32_OVER - 1 and created["record"]["daily_tokens"] == INT32_OVER - 1


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("grace_s", {"grace_s": "nan"}),
        ("grace_s", {"grace_s": "inf"}),
        ("grace_s", {"grace_s": 1e300}),
        ("grace_s", {"grace_s": -1}),
        ("grace_s", {"grace_s": True}),
        ("grace_s", {"grace_s": "3600"}),
        ("grace", {"grace": 3600}),
    ],
)
async def test_bad_rotation_changes_nothing(gw: Gateway, field: str, body: dict[str, Any]) -> None:
    _, created = await call(gw, "POST", "/admin/api/keys", {"app": "web"})
    prefix = created["record"]["prefix"]
    assert_422(*await call(gw, "POST", f"/admin/api/keys/{prefix}/rotate", body), field)
    [key] = (await call(gw, "GET", "/admin/api/keys"))[1]["keys"]
    assert key["expires_at"] is None
    assert await audit_actions(gw) == ["key.create"]


@pytest.mark.parametrize(
    "ref", ["99999999999999999999", "2147483648", "\u0661\u0662", "tk_" + "x" * 43, "x" * 300, "%00", "-1", "1.0"]
)
async def test_odd_key_references_are_not_found(gw: Gateway, ref: str) -> None:
    status, body = await call(gw, "POST", f"/admin/api/keys/{quote(ref, safe='%')}/revoke")
    assert status == 404, body
    assert ref[3:] not in body["error"]["message"] or not ref.startswith("tk_")  # a whole key is never echoed


@pytest.mark.parametrize(
    ("field", "query"),
    [
        ("since", "since=nan"),
        ("since", "since=inf"),
        ("since", "since=-1"),
        ("since", "since=1e999"),
        ("since", "since=9999999999999999999999"),
        ("since", "since=99999999999d"),
        ("since", "since=" + "x" * 100),
        ("bucket", "bucket=week"),
        ("key", "key=" + "k" * 200),
        ("key", "key=%00abc"),
    ],
)
async def test_bad_usage_query(gw: Gateway, field: str, query: str) -> None:
    assert_422(*await call(gw, "GET", f"/admin/api/usage?{query}"), field)


@pytest.mark.parametrize(
    ("field", "query"),
    [
        ("limit", "limit=9223372036854775808"),
        ("limit", "limit=99999999999999999999999999"),
        ("limit", "limit=0"),
        ("limit", "limit=-1"),
        ("limit", "limit=10001"),
        ("limit", "limit=nan"),
        ("limit", "limit=%D9%A1%D9%A2"),  # Arabic-Indic digits
        ("since", "since=nan"),
        ("since", "since=-inf"),
        ("action", "action=" + "a" * 65),
        ("action", "action=key.create%0A"),
    ],
)
async def test_bad_audit_query(gw: Gateway, field: str, query: str) -> None:
    assert_422(*await call(gw, "GET", f"/admin/api/audit?{query}"), field)


async def test_good_queries_still_answer(gw: Gateway) -> None:
    for path in (
        "/admin/api/usage?since=7d&bucket=day",
        "/admin/api/usage?since=2026-01-01T00:00:00Z&_=123",
        "/admin/api/audit?limit=10000&since=1700000000",
        "/admin/api/audit?action=key.create",
    ):
        assert (await call(gw, "GET", path))[0] == 200, path


REGISTER = {"name": "mac", "url": "http://127.0.0.1:9", "api": "ollama"}


@pytest.mark.parametrize(
    ("field", "changes"),
    [
        ("name", {"name": "x" * 65}),
        ("name", {"name": "a b"}),
        ("name", {"name": 5}),
        ("url", {"url": "http://x:99999"}),
        ("url", {"url": "http://x y"}),
        ("url", {"url": "http://x/\r\nHost: evil"}),
        ("url", {"url": None}),
        ("url", {"url": "http://x/" + "p" * 2100}),
        ("api", {"api": "grpc"}),
        ("credential", {"credential": "key\r\nX-Injected: 1"}),
        ("credential", {"credential": "c" * 9000}),
        ("credential", {"credential": ["k"]}),
        ("fallback_model", {"fallback_model": "m\x00"}),
        ("fallback_model", {"fallback_model": "m" * 257}),
        ("fallback_model", {"fallback_model": "qwen3:*"}),
        ("fallback_model", {"fallback_model": True}),
        ("latency_budget_ms", {"latency_budget_ms": HUGE}),
        ("latency_budget_ms", {"latency_budget_ms": 600_001}),
        ("latency_budget_ms", {"latency_budget_ms": 0}),
        ("latency_budget_ms", {"latency_budget_ms": "nan"}),
        ("latency_budget_ms", {"latency_budget_ms": 1500.0}),
        ("latency_budget_ms", {"latency_budget_ms": False}),
    ],
)
async def test_bad_endpoint_registration_stores_nothing(gw: Gateway, field: str, changes: dict[str, Any]) -> None:
    assert_422(*await call(gw, "POST", "/admin/api/endpoints", {**REGISTER, **changes}), field)
    assert (await call(gw, "GET", "/admin/api/endpoints"))[1]["endpoints"] == []
    assert gw.app[KEYS].count() == 0  # no endpoint key either
    assert await audit_actions(gw) == []


@pytest.mark.parametrize(
    ("field", "changes"),
    [
        ("name", {"name": "other"}),
        ("url", {"url": None}),
        ("url", {"url": "gopher://x"}),
        ("api", {"api": None}),
        ("api", {"api": "grpc"}),
        ("credential", {"credential": "a\nb"}),
        ("fallback_model", {"fallback_model": "m\x7f"}),
        ("latency_budget_ms", {"latency_budget_ms": 10**12}),
        ("latency_budget_ms", {"latency_budget_ms": -1}),
        ("colour", {"colour": "red"}),
    ],
)
async def test_bad_endpoint_change_changes_nothing(gw: Gateway, field: str, changes: dict[str, Any]) -> None:
    assert (await call(gw, "POST", "/admin/api/endpoints", {**REGISTER, "latency_budget_ms": 1500}))[0] == 201
    before = (await call(gw, "GET", "/admin/api/endpoints"))[1]
    assert_422(*await call(gw, "PATCH", "/admin/api/endpoints/mac", changes), field)
    assert (await call(gw, "GET", "/admin/api/endpoints"))[1] == before
    assert await audit_actions(gw) == ["key.create", "endpoint.register"]  # the key registration printed


async def test_endpoint_bounds_and_removals(gw: Gateway) -> None:
    status, reg = await call(
        gw, "POST", "/admin/api/endpoints", {**REGISTER, "latency_budget_ms": 600_000, "fallback_model": "qwen3:8b"}
    )
    assert status == 201 and reg["endpoint"]["latency_budget_ms"] == 600_000, reg
    status, changed = await call(
        gw, "PATCH", "/admin/api/endpoints/mac", {"fallback_model": "", "latency_budget_ms": None}
    )
    assert status == 200, changed
    [endpoint] = (await call(gw, "GET", "/admin/api/endpoints"))[1]["endpoints"]
    assert endpoint["fallback_model"] is None and endpoint["latency_budget_ms"] is None


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("model", {}),
        ("model", {"model": 5}),
        ("model", {"model": ""}),
        ("model", {"model": "m\x00"}),
        ("model", {"model": "m" * 257}),
        ("model", {"model": "qwen3:*"}),
        ("extra", {"model": "qwen3:8b", "extra": 1}),
    ],
)
async def test_bad_toggle_writes_nothing(gw: Gateway, field: str, body: dict[str, Any]) -> None:
    assert_422(*await call(gw, "POST", "/admin/api/placement/workers/a/toggle", body), field)
    assert not gw.settings.placement_file.exists()
    assert await audit_actions(gw) == []


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("allowed_models[0]", {"allowed_models": ["m\x00"]}),
        ("denied_models[1]", {"denied_models": ["ok", "m" * 257]}),
        ("allowed_models", {"allowed_models": ["m"] * 1001}),
    ],
)
async def test_bad_placement_rules_write_nothing(gw: Gateway, field: str, body: dict[str, Any]) -> None:
    status, reply = await call(gw, "PUT", "/admin/api/placement/workers/a", {"mode": "whitelist", **body})
    assert status == 422 and f'"{field}' in reply["error"]["message"], reply
    assert not gw.settings.placement_file.exists()
    assert await audit_actions(gw) == []
