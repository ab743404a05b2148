"""Key and usage API additions for the UI: PATCH with If-Match, computed state, last_used, filters,
tenants and apps; usage filters, a time-bucketed series and CSV."""

from __future__ import annotations

import csv
import io
import itertools
import time
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from tests.conftest import EmulatorFactory, Gateway, GatewayFactory, worker
from turnout.gateway.keys import ACCOUNTANT, USAGE
from turnout.store.usage import UsageRow, csv_cell

CHAT = {"model": "qwen3:8b", "messages": [], "stream": False}


async def call(
    gw: Gateway, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None, key: str = ""
) -> tuple[int, Any, CIMultiDict[str]]:
    sent = {"Authorization": f"Bearer {key}"} if key else gw.admin_headers
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{gw.url}{path}", json=body, headers={**sent, **(headers or {})}) as resp,
    ):
        text = await resp.text()
        data = await resp.json() if resp.content_type == "application/json" else text
        return resp.status, data, CIMultiDict(resp.headers)


@pytest.fixture
async def gw(emulator: EmulatorFactory, gateway: GatewayFactory) -> Gateway:
    a = await emulator("a", ["qwen3:8b", "llama3.2:latest"])
    b = await emulator("b", ["llama3.2:latest"])
    return await gateway([worker("a", a.url), worker("b", b.url)], auth={"open": False})


async def new_key(gw: Gateway, **body: Any) -> dict[str, Any]:
    status, created, _ = await call(gw, "POST", "/admin/api/keys", {"app": "web", **body})
    assert status == 201, created
    return created


async def test_patch_scopes_and_limits_with_if_match(gw: Gateway) -> None:
    created = await new_key(gw, models=["model:qwen3:*"], rpm=10)
    prefix, etag = created["record"]["prefix"], created["record"]["etag"]
    assert created["record"]["state"] == "active" and created["record"]["last_used"] is None
    assert (await call(gw, "POST", "/api/chat", {**CHAT, "model": "llama3.2"}, key=created["key"]))[0] == 403
    status, changed, headers = await call(
        gw,
        "PATCH",
        f"/admin/api/keys/{prefix}",
        {"models": ["model:llama3.2"], "rpm": None, "daily_tokens": 5000},
        headers={"If-Match": etag},
    )
    assert status == 200 and headers["ETag"] == changed["etag"] != etag
    assert changed["models"] == ["model:llama3.2"] and changed["rpm"] is None and changed["daily_tokens"] == 5000
    # the change applies to the next request at once
    assert (await call(gw, "POST", "/api/chat", {**CHAT, "model": "llama3.2"}, key=created["key"]))[0] == 200
    # a stale tab is told, and nothing changes
    status, body, headers = await call(gw, "PATCH", f"/admin/api/keys/{prefix}", {"rpm": 1}, headers={"If-Match": etag})
    assert status == 412 and body["error"]["code"] == "stale_write" and headers["ETag"] == changed["etag"]
    status, body, _ = await call(gw, "POST", f"/admin/api/keys/{prefix}/revoke", headers={"If-Match": etag})
    assert status == 412
    _, view, _ = await call(gw, "GET", f"/admin/api/keys/{prefix}")
    assert view["rpm"] is None and view["state"] == "active" and view["etag"] == changed["etag"]
    _, audit, _ = await call(gw, "GET", "/admin/api/audit?action=key.change")
    [entry] = audit["entries"]
    assert entry["before"]["models"] == ["model:qwen3:*"] and entry["after"]["models"] == ["model:llama3.2"]
    assert entry["before"]["rpm"] == 10 and entry["after"]["rpm"] is None and created["key"] not in str(audit)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({}, "nothing to change"),
        ({"rpm": 0}, '"rpm" must be at least 1'),
        ({"models": []}, '"models"'),
        ({"models": None}, "cannot be removed"),
        ({"models": ["q*x"]}, "last character"),
        ({"expires": "someday"}, "cannot read time"),
        ({"app": "other"}, "unknown field"),
    ],
)
async def test_bad_patch_is_422_and_changes_nothing(gw: Gateway, body: dict[str, Any], fragment: str) -> None:
    created = await new_key(gw, rpm=10)
    status, reply, _ = await call(gw, "PATCH", f"/admin/api/keys/{created['record']['prefix']}", body)
    assert status == 422 and fragment in reply["error"]["message"]
    _, view, _ = await call(gw, "GET", f"/admin/api/keys/{created['record']['prefix']}")
    assert view["etag"] == created["record"]["etag"]
    _, audit, _ = await call(gw, "GET", "/admin/api/audit?action=key.change")
    assert audit["entries"] == []


async def test_revoked_key_cannot_be_changed(gw: Gateway) -> None:
    created = await new_key(gw)
    prefix = created["record"]["prefix"]
    await call(gw, "POST", f"/admin/api/keys/{prefix}/revoke")
    status, body, _ = await call(gw, "PATCH", f"/admin/api/keys/{prefix}", {"rpm": 5})
    assert status == 409 and body["error"]["code"] == "key_revoked"
    assert (await call(gw, "PATCH", "/admin/api/keys/tk_nothing", {"rpm": 5}))[0] == 404


async def test_states_grace_and_last_used(gw: Gateway) -> None:
    old = await new_key(gw)
    before = now = time.time()
    assert (await call(gw, "POST", "/api/chat", CHAT, key=old["key"]))[0] == 200
    _, rotated, _ = await call(gw, "POST", f"/admin/api/keys/{old['record']['prefix']}/rotate", {"grace_s": 3600})
    assert rotated["old"]["state"] == "in_grace" and rotated["old"]["grace_until"] == rotated["old"]["expires_at"]
    assert rotated["record"]["state"] == "active" and rotated["record"]["grace_until"] is None
    gone = await new_key(gw, app="gone")
    await call(gw, "POST", f"/admin/api/keys/{gone['record']['prefix']}/revoke")
    past = await new_key(gw, app="past", expires="30d")
    _, listing, _ = await call(gw, "GET", "/admin/api/keys")
    states = {k["prefix"]: k["state"] for k in listing["keys"]}
    assert states[old["record"]["prefix"]] == "in_grace" and states[gone["record"]["prefix"]] == "revoked"
    assert states[rotated["record"]["prefix"]] == "active"
    used = {k["prefix"]: k["last_used"] for k in listing["keys"]}
    assert used[old["record"]["prefix"]] is not None and before - 60 <= used[old["record"]["prefix"]] <= time.time()
    assert used[rotated["record"]["prefix"]] is None
    # state filter; the expired key shows once its time has passed
    _, revoked, _ = await call(gw, "GET", "/admin/api/keys?state=revoked")
    assert [k["prefix"] for k in revoked["keys"]] == [gone["record"]["prefix"]]
    status, _, _ = await call(gw, "PATCH", f"/admin/api/keys/{past['record']['prefix']}", {"expires": int(now) - 60})
    assert status == 200
    _, expired, _ = await call(gw, "GET", "/admin/api/keys?state=expired")
    assert [k["prefix"] for k in expired["keys"]] == [past["record"]["prefix"]]
    assert (await call(gw, "GET", "/admin/api/keys?state=sleeping"))[0] == 422


async def test_key_filters_tenants_and_apps(gw: Gateway) -> None:
    a = await new_key(gw, app="web", tenant="team-a", models=["mac/*"])
    b = await new_key(gw, app="batch", tenant="team-b", models=["qwen3:*"])
    c = await new_key(gw, app="web")  # every model: reaches every endpoint
    await call(gw, "POST", f"/admin/api/keys/{c['record']['prefix']}/revoke")

    async def prefixes(query: str) -> list[str]:
        status, body, _ = await call(gw, "GET", f"/admin/api/keys?{query}")
        assert status == 200, body
        return [k["prefix"] for k in body["keys"]]

    pa, pb, pc = a["record"]["prefix"], b["record"]["prefix"], c["record"]["prefix"]
    assert await prefixes("tenant=team-a") == [pa, pc]
    assert await prefixes("app=batch") == [pb]
    assert await prefixes("endpoint=mac") == [pa, pc]
    assert await prefixes("endpoint=mac&state=active") == [pa]
    assert await prefixes("tenant=nobody") == []
    _, tenants, _ = await call(gw, "GET", "/admin/api/tenants")
    assert [(t["name"], t["apps"], t["keys"]) for t in tenants["tenants"]] == [("team-a", 1, 2), ("team-b", 1, 1)]
    _, apps, _ = await call(gw, "GET", "/admin/api/apps")
    assert [(x["name"], x["tenant"], x["keys"]) for x in apps["apps"]] == [("batch", "team-b", 1), ("web", "team-a", 2)]


async def test_usage_filters_series_and_csv(gw: Gateway) -> None:
    created = await new_key(gw)
    key = created["key"]
    for model in ("qwen3:8b", "qwen3:8b", "llama3.2"):
        assert (await call(gw, "POST", "/api/chat", {**CHAT, "model": model}, key=key))[0] == 200
    status, rows, _ = await call(gw, "GET", "/admin/api/usage?model=qwen3:8b")
    assert status == 200 and [r["requests"] for r in rows["rows"]] == [2]
    assert rows["filters"]["model"] == "qwen3:8b"
    _, on_a, _ = await call(gw, "GET", "/admin/api/usage?worker=a&bucket=day")
    _, on_b, _ = await call(gw, "GET", "/admin/api/usage?worker=b&bucket=day")
    assert sum(r["requests"] for r in on_a["rows"] + on_b["rows"]) == 3
    assert all(r["worker"] == "a" for r in on_a["rows"]) and all(r["worker"] == "b" for r in on_b["rows"])
    _, routes, _ = await call(gw, "GET", "/admin/api/usage?route=ollama:chat")
    assert sum(r["requests"] for r in routes["rows"]) == 3
    status, series, _ = await call(
        gw, "GET", f"/admin/api/usage/series?since=10m&bucket=minute&key={created['record']['prefix']}"
    )
    assert status == 200 and 10 <= len(series["points"]) <= 12
    assert sum(p["requests"] for p in series["points"]) == 3
    busy = [p for p in series["points"] if p["requests"]]
    assert all(p["latency_ms_p50"] is not None and p["latency_ms_p95"] >= p["latency_ms_p50"] for p in busy)
    assert all(p["latency_ms_p50"] is None and p["prompt_tokens"] == 0 for p in series["points"] if not p["requests"])
    starts = [p["bucket_start"] for p in series["points"]]
    assert starts == sorted(starts) and {b - a for a, b in itertools.pairwise(starts)} == {60}
    status, text, headers = await call(gw, "GET", "/admin/api/usage?format=csv&bucket=day")
    assert status == 200 and headers["Content-Type"].startswith("text/csv")
    assert "attachment" in headers["Content-Disposition"]
    table = list(csv.DictReader(io.StringIO(text)))
    assert sum(int(r["requests"]) for r in table) == 3 and {r["worker"] for r in table} <= {"a", "b"}
    status, text, _ = await call(gw, "GET", "/admin/api/usage/series?format=csv&since=1h&bucket=minute")
    assert status == 200 and text.splitlines()[0].startswith("bucket_start,bucket_start_utc,requests")
    assert (await call(gw, "GET", "/admin/api/usage/series?since=30d&bucket=minute"))[0] == 422
    assert (await call(gw, "GET", "/admin/api/usage?format=xml"))[0] == 422
    assert (await call(gw, "GET", "/admin/api/usage/series?since=1h&until=2h"))[0] == 422


async def test_usage_by_endpoint_counts_its_fallbacks(gw: Gateway) -> None:
    accountant = gw.app[ACCOUNTANT]
    now = time.time()
    for worker_name, origin in (("mac", None), ("a", "mac/llama3.2:latest"), ("a", None)):
        accountant.usage.add(
            UsageRow(now, None, "ollama:chat", "llama3.2:latest", worker_name, 200, False, 1, 1, 5.0, origin)
        )
    await accountant.usage.flush()
    _, rows, _ = await call(gw, "GET", "/admin/api/usage?endpoint=mac")
    assert sorted((r["worker"], r["fallback_from"]) for r in rows["rows"]) == [
        ("a", "mac/llama3.2:latest"),
        ("mac", None),
    ]
    assert gw.app[USAGE].fallback_counts(since=0) == {"mac": {"total": 1, "since": 1}}
    # a name with LIKE wildcards matches only itself
    _, none, _ = await call(gw, "GET", "/admin/api/usage?endpoint=m_c")
    assert none["rows"] == []


def test_csv_cells_are_not_formulas() -> None:
    assert csv_cell("=HYPERLINK(1)") == "'=HYPERLINK(1)" and csv_cell("qwen3:8b") == "qwen3:8b"
    assert csv_cell(None) == "" and csv_cell(3) == 3


async def test_audit_filters_by_actor_target_and_time(gw: Gateway) -> None:
    created = await new_key(gw)
    prefix = created["record"]["prefix"]
    await call(gw, "POST", f"/admin/api/keys/{prefix}/revoke")
    await call(gw, "POST", "/admin/api/placement/workers/a/toggle", {"model": "qwen3:8b"})
    _, by_target, _ = await call(gw, "GET", f"/admin/api/audit?target=key:{prefix}")
    assert [e["action"] for e in by_target["entries"]] == ["key.revoke", "key.create"]
    _, by_actor, _ = await call(gw, "GET", "/admin/api/audit?actor=token&action=placement.toggle")
    assert [e["target"] for e in by_actor["entries"]] == ["worker:a model:qwen3:8b"]
    _, future, _ = await call(gw, "GET", "/admin/api/audit?until=2000-01-01")
    assert future["entries"] == []
    _, facets, _ = await call(gw, "GET", "/admin/api/audit/facets")
    assert {"key.create", "key.revoke", "placement.toggle"} <= set(facets["actions"])
    assert "token" in facets["actors"]
    assert (await call(gw, "GET", "/admin/api/audit?actor=" + "x" * 200))[0] == 422


async def test_revoking_a_revoked_key_says_so_and_audits_nothing(gw: Gateway) -> None:
    prefix = (await new_key(gw, app="web"))["record"]["prefix"]
    assert (await call(gw, "POST", f"/admin/api/keys/{prefix}/revoke"))[0] == 200
    status, body, _ = await call(gw, "POST", f"/admin/api/keys/{prefix}/revoke")
    assert status == 409 and body["error"]["code"] == "key_revoked"
    assert f"key {prefix} was already revoked at " in body["error"]["message"]
    assert "nothing changed" in body["error"]["message"]
    _, audit, _ = await call(gw, "GET", f"/admin/api/audit?action=key.revoke&target=key:{prefix}")
    assert len(audit["entries"]) == 1
