"""Placement API additions for the UI: baseline and origins, ETag / If-Match, "only installed"."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from ollama import ResponseError

from tests.conftest import Clients, EmulatorFactory, Gateway, GatewayFactory, worker
from turnout.gateway.keys import FLEET

SEED = {"mode": "allow_all", "allowed_models": ["gemma4:latest"], "denied_models": ["gemma4:*"]}


async def call(
    gw: Gateway, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None
) -> tuple[int, Any, CIMultiDict[str]]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{gw.url}{path}", json=body, headers={**gw.admin_headers, **(headers or {})}) as resp,
    ):
        return resp.status, await resp.json(), CIMultiDict(resp.headers)


@pytest.fixture
async def fleet(emulator: EmulatorFactory, gateway: GatewayFactory) -> Gateway:
    a = await emulator("a", ["gemma4:latest", "gemma4:2b", "qwen3:8b"], loaded=["gemma4:latest"])
    b = await emulator("b", ["gemma4:2b"])
    return await gateway([worker("a", a.url, model_placement=SEED), worker("b", b.url)])


def row(matrix: dict[str, Any], name: str) -> dict[str, Any]:
    return next(w for w in matrix["workers"] if w["name"] == name)


async def test_matrix_shows_baseline_override_and_origins(fleet: Gateway) -> None:
    _, matrix, headers = await call(fleet, "GET", "/admin/api/placement")
    a = row(matrix, "a")
    assert a["baseline"] == SEED and a["override"] is None and a["etag"].startswith('"')
    assert a["exact_rules"] == [{"model": "gemma4:latest", "list": "allowed", "origin": "config"}]
    assert a["cells"]["gemma4:latest"]["origin"] == "config" and a["cells"]["qwen3:8b"]["origin"] == "config"
    assert headers["ETag"].startswith('"')
    # a click on a config-decided exact cell writes the opposite exact rule into the override, in its place
    status, toggled, _ = await call(fleet, "POST", "/admin/api/placement/workers/a/toggle", {"model": "gemma4:latest"})
    assert status == 200 and toggled["allowed"] is False and toggled["origin"] == "ui"
    assert toggled["rules"]["allowed_models"] == []
    _, matrix, _ = await call(fleet, "GET", "/admin/api/placement")
    a = row(matrix, "a")
    assert a["override"] == {"mode": "allow_all", "allowed_models": [], "denied_models": ["gemma4:*", "gemma4:latest"]}
    assert a["baseline"] == SEED and a["mode_origin"] == "config"
    assert a["exact_rules"] == [{"model": "gemma4:latest", "list": "denied", "origin": "ui"}]
    cell = a["cells"]["gemma4:latest"]
    assert cell["allowed"] is False and cell["origin"] == "ui" and cell["source"] == "override"
    assert cell["rule"] == "gemma4:latest" and cell["exact"] is True
    assert a["cells"]["gemma4:2b"]["origin"] == "config"  # the prefix rule copied from the baseline
    # the second click removes the UI exception: the config rule is in force again
    _, toggled, _ = await call(fleet, "POST", "/admin/api/placement/workers/a/toggle", {"model": "gemma4:latest"})
    assert toggled["allowed"] is True and toggled["origin"] == "config" and toggled["rules"] == SEED


async def test_a_click_outvotes_an_exact_config_deny_and_the_next_restores_it(
    emulator: EmulatorFactory, gateway: GatewayFactory, clients: Clients
) -> None:
    emu = await emulator("a", ["x:1"])
    gw = await gateway([worker("a", emu.url, model_placement={"mode": "allow_all", "denied_models": ["x:1"]})])
    client = clients.ollama(gw.url)
    with pytest.raises(ResponseError):  # blocked by the config's exact deny
        await client.chat(model="x:1", messages=[])
    _, matrix, _ = await call(gw, "GET", "/admin/api/placement")
    cell = row(matrix, "a")["cells"]["x:1"]
    assert (cell["allowed"], cell["rule"], cell["exact"], cell["origin"]) == (False, "x:1", True, "config")

    status, body, _ = await call(gw, "POST", "/admin/api/placement/workers/a/toggle", {"model": "x:1"})
    assert status == 200, body
    assert (body["allowed"], body["rule"], body["exact"], body["origin"]) == (True, "x:1", True, "ui")
    assert body["rules"] == {"mode": "allow_all", "allowed_models": ["x:1"], "denied_models": []}
    _, matrix, _ = await call(gw, "GET", "/admin/api/placement")
    cell = row(matrix, "a")["cells"]["x:1"]
    assert (cell["allowed"], cell["rule"], cell["source"], cell["origin"]) == (True, "x:1", "override", "ui")
    assert (await client.chat(model="x:1", messages=[])).message.content.startswith("[a]")  # the router obeys
    assert "x:1" in {m.model for m in (await client.list()).models}  # and discovery lists it

    status, body, _ = await call(gw, "POST", "/admin/api/placement/workers/a/toggle", {"model": "x:1"})
    assert status == 200 and (body["allowed"], body["origin"]) == (False, "config")
    assert body["rules"] == {"mode": "allow_all", "allowed_models": [], "denied_models": ["x:1"]}
    with pytest.raises(ResponseError):
        await client.chat(model="x:1", messages=[])
    assert "x:1" not in {m.model for m in (await client.list()).models}
    _, audit, _ = await call(gw, "GET", "/admin/api/audit?action=placement.toggle")
    assert [e["target"] for e in audit["entries"]] == ["worker:a model:x:1"] * 2


async def test_worker_view_and_etag(fleet: Gateway) -> None:
    status, view, headers = await call(fleet, "GET", "/admin/api/placement/workers/a")
    assert status == 200 and headers["ETag"] == view["etag"]
    assert view["baseline"] == SEED and view["installed"] == ["gemma4:2b", "gemma4:latest", "qwen3:8b"]
    assert view["inventory_known"] is True and view["inventory_stale"] is False
    _, matrix, _ = await call(fleet, "GET", "/admin/api/placement")
    assert row(matrix, "a")["etag"] == view["etag"]
    assert (await call(fleet, "GET", "/admin/api/placement/workers/zz"))[0] == 404


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("PUT", "", {"mode": "whitelist"}),
        ("POST", "/toggle", {"model": "qwen3:8b"}),
        ("DELETE", "", None),
        ("POST", "/only-installed", {}),
    ],
)
async def test_stale_write_is_412_and_changes_nothing(fleet: Gateway, method: str, suffix: str, body: Any) -> None:
    _, first, _ = await call(fleet, "GET", "/admin/api/placement/workers/a")
    # another tab changes the worker
    status, _, _ = await call(
        fleet,
        "POST",
        "/admin/api/placement/workers/a/toggle",
        {"model": "gemma4:2b"},
        headers={"If-Match": first["etag"]},
    )
    assert status == 200
    on_disk = fleet.settings.placement_file.read_text()
    _, now, _ = await call(fleet, "GET", "/admin/api/placement/workers/a")
    assert now["etag"] != first["etag"]
    path = f"/admin/api/placement/workers/a{suffix}"
    status, reply, headers = await call(fleet, method, path, body, headers={"If-Match": first["etag"]})
    assert status == 412 and reply["error"]["code"] == "stale_write"
    assert "has changed since you read it" in reply["error"]["message"] and headers["ETag"] == now["etag"]
    assert fleet.settings.placement_file.read_text() == on_disk
    # with the current tag (or none at all) the same write goes through
    status, _, headers = await call(fleet, method, path, body, headers={"If-Match": now["etag"]})
    assert status == 200 and headers["ETag"] != now["etag"]


async def test_other_workers_do_not_conflict_and_star_matches(fleet: Gateway) -> None:
    _, a, _ = await call(fleet, "GET", "/admin/api/placement/workers/a")
    await call(fleet, "PUT", "/admin/api/placement/workers/b", {"mode": "whitelist"})
    status, _, _ = await call(
        fleet, "POST", "/admin/api/placement/workers/a/toggle", {"model": "qwen3:8b"}, headers={"If-Match": a["etag"]}
    )
    assert status == 200
    status, _, _ = await call(fleet, "DELETE", "/admin/api/placement/workers/a", headers={"If-Match": "*"})
    assert status == 200


async def test_only_installed(fleet: Gateway) -> None:
    status, body, headers = await call(fleet, "POST", "/admin/api/placement/workers/a/only-installed")
    assert status == 200 and headers["ETag"] == body["etag"]
    assert body["rules"] == {
        "mode": "whitelist",
        "allowed_models": ["gemma4:2b", "gemma4:latest", "qwen3:8b"],
        "denied_models": [],
    }
    assert json.loads(fleet.settings.placement_file.read_text())["workers"]["a"] == body["rules"]
    _, audit, _ = await call(fleet, "GET", "/admin/api/audit?action=placement.only_installed")
    assert audit["entries"][0]["after"]["rules"] == body["rules"]


async def test_only_installed_refuses_unknown_and_stale_inventory(fleet: Gateway) -> None:
    state = fleet.app[FLEET].workers["b"]
    state.inventory_failed("HTTP 500 from /api/tags")
    status, body, _ = await call(fleet, "POST", "/admin/api/placement/workers/b/only-installed", {})
    assert status == 409 and body["error"]["code"] == "inventory_stale" and "accept_stale" in body["error"]["message"]
    assert not fleet.settings.placement_file.exists()
    status, body, _ = await call(fleet, "POST", "/admin/api/placement/workers/b/only-installed", {"accept_stale": True})
    assert status == 200 and body["inventory_stale"] is True and body["rules"]["allowed_models"] == ["gemma4:2b"]
    state.inventory = None
    state.inventory_stale = False
    status, body, _ = await call(fleet, "POST", "/admin/api/placement/workers/b/only-installed")
    assert status == 409 and body["error"]["code"] == "inventory_unknown"
    assert "not known yet" in body["error"]["message"] and "HTTP 500" in body["error"]["message"]
    _, matrix, _ = await call(fleet, "GET", "/admin/api/placement")
    assert row(matrix, "b")["inventory_known"] is False
    status, body, _ = await call(fleet, "POST", "/admin/api/placement/workers/b/only-installed", {"colour": 1})
    assert status == 422 and "unknown field" in body["error"]["message"]


async def test_matrix_etag_validates_the_whole_answer(fleet: Gateway) -> None:
    _, _, headers = await call(fleet, "GET", "/admin/api/placement")
    etag = headers["ETag"]
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{fleet.url}/admin/api/placement", headers={**fleet.admin_headers, "If-None-Match": etag}) as r,
    ):
        assert r.status == 304 and r.headers["ETag"] == etag
    fleet.app[FLEET].workers["b"].loaded = frozenset({"gemma4:2b"})  # residency changed, rules did not
    _, matrix, headers = await call(fleet, "GET", "/admin/api/placement", headers={"If-None-Match": etag})
    assert headers["ETag"] != etag and row(matrix, "b")["cells"]["gemma4:2b"]["loaded"] is True
