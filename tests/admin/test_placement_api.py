"""The admin placement API: matrix, overrides, toggle, delete; effects on the next request."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import Clients, EmulatorFactory, Gateway, GatewayFactory, worker
from turnout.state.placement_store import PlacementFileError

SEED = {"mode": "allow_all", "allowed_models": ["gemma4:latest"], "denied_models": ["gemma4:*"]}


async def call(gw: Gateway, method: str, path: str, body: Any = None, *, auth: bool = True) -> tuple[int, Any]:
    headers = gw.admin_headers if auth else {}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{gw.url}{path}", json=body, headers=headers) as resp,
    ):
        return resp.status, await resp.json()


@pytest.fixture
async def fleet(emulator: EmulatorFactory, gateway: GatewayFactory) -> Gateway:
    a = await emulator("a", ["gemma4:latest", "gemma4:2b", "qwen3:8b"], loaded=["gemma4:latest"])
    b = await emulator("b", ["gemma4:2b"])
    return await gateway([worker("a", a.url, model_placement=SEED), worker("b", b.url)])


def overrides_file(gw: Gateway) -> Path:
    return gw.settings.placement_file


async def test_requires_admin_token(fleet: Gateway) -> None:
    status, body = await call(fleet, "GET", "/admin/api/placement", auth=False)
    assert status == 401 and "Bearer" in body["error"]["message"]
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{fleet.url}/admin/api/inventory", headers={"Authorization": "Bearer wrong"}) as resp,
    ):
        assert resp.status == 401


async def test_matrix(fleet: Gateway) -> None:
    status, body = await call(fleet, "GET", "/admin/api/placement")
    assert status == 200
    assert body["models"] == ["gemma4:2b", "gemma4:latest", "qwen3:8b"]
    a = {w["name"]: w for w in body["workers"]}["a"]["cells"]
    b = {w["name"]: w for w in body["workers"]}["b"]["cells"]
    assert a["gemma4:latest"] == {
        "installed": True,
        "loaded": True,
        "allowed": True,
        "rule": "gemma4:latest",
        "source": "config",
        "exact": True,
        "origin": "config",
    }
    assert a["gemma4:2b"] == {
        "installed": True,
        "loaded": False,
        "allowed": False,
        "rule": "gemma4:*",
        "source": "config",
        "exact": False,
        "origin": "config",
    }
    assert b["qwen3:8b"] == {
        "installed": False,
        "loaded": False,
        "allowed": True,
        "rule": "mode",
        "source": "config",
        "exact": False,
        "origin": "config",
    }
    assert body["override_file"]["error"] is None


async def test_toggle_add_then_remove(fleet: Gateway, clients: Clients) -> None:
    client = clients.ollama(fleet.url)
    # gemma4:2b is blocked on a by prefix; b has it, so requests go to b
    assert (await client.chat(model="gemma4:2b", messages=[])).message.content.startswith("[b]")
    status, body = await call(fleet, "POST", "/admin/api/placement/workers/b/toggle", {"model": "gemma4:2b"})
    assert status == 200 and body["allowed"] is False and body["rule"] == "gemma4:2b"
    status, body = await call(fleet, "POST", "/admin/api/placement/workers/a/toggle", {"model": "gemma4:2b"})
    assert status == 200 and body["allowed"] is True and body["exact"] is True
    # next request, no restart: b now denies exactly, a allows exactly
    assert (await client.chat(model="gemma4:2b", messages=[])).message.content.startswith("[a]")
    on_disk = json.loads(overrides_file(fleet).read_text())
    assert on_disk["workers"]["a"]["allowed_models"] == ["gemma4:latest", "gemma4:2b"]
    assert on_disk["workers"]["b"] == {"mode": "allow_all", "allowed_models": [], "denied_models": ["gemma4:2b"]}
    # toggling the exact rule again removes it: the broader rule (gemma4:*) decides once more
    status, body = await call(fleet, "POST", "/admin/api/placement/workers/a/toggle", {"model": "gemma4:2b"})
    assert body["allowed"] is False and body["rule"] == "gemma4:*"
    _, matrix = await call(fleet, "GET", "/admin/api/placement")
    cell = {w["name"]: w for w in matrix["workers"]}["a"]["cells"]["gemma4:2b"]
    assert cell["source"] == "override" and cell["allowed"] is False


@pytest.mark.parametrize(
    ("written", "clicked", "cell"),
    [
        ("qwen3:8b", "qwen3:8b", "qwen3:8b"),
        ("gemma4", "gemma4:latest", "gemma4:latest"),
        ("gemma4:latest", "gemma4", "gemma4:latest"),
    ],
)
async def test_a_click_on_a_redundant_exception_removes_it(
    fleet: Gateway, written: str, clicked: str, cell: str
) -> None:
    """An exact allow made through the API on a worker that allows all (it says what the mode says) is a UI
    exception: clicking it removes it, as clicking any UI exception does, and never writes the opposite rule."""
    rules = {"mode": "allow_all", "allowed_models": [written], "denied_models": []}
    status, body = await call(fleet, "PUT", "/admin/api/placement/workers/b", rules)
    assert status == 200, body
    _, matrix = await call(fleet, "GET", "/admin/api/placement")
    before = {w["name"]: w for w in matrix["workers"]}["b"]["cells"][cell]
    assert (before["allowed"], before["exact"], before["origin"]) == (True, True, "ui")
    status, body = await call(fleet, "POST", "/admin/api/placement/workers/b/toggle", {"model": clicked})
    assert status == 200, body
    assert (body["allowed"], body["rule"], body["exact"], body["origin"]) == (True, "mode", False, "config")
    assert body["exact_rules"] == []
    on_disk = json.loads(overrides_file(fleet).read_text())["workers"]["b"]
    assert on_disk == {"mode": "allow_all", "allowed_models": [], "denied_models": []}
    _, matrix = await call(fleet, "GET", "/admin/api/placement")
    after = {w["name"]: w for w in matrix["workers"]}["b"]["cells"][cell]
    assert (after["allowed"], after["exact"], after["origin"]) == (True, False, "config")


async def test_put_and_delete_override(fleet: Gateway, clients: Clients) -> None:
    client = clients.ollama(fleet.url)
    rules = {"mode": "whitelist", "allowed_models": ["qwen3:*"], "denied_models": []}
    status, body = await call(fleet, "PUT", "/admin/api/placement/workers/a", rules)
    assert status == 200 and body["rules"] == rules
    names = {m.model for m in (await client.list()).models}
    assert names == {"qwen3:8b", "gemma4:2b"}  # gemma4:latest is only on a, now outside its whitelist
    status, body = await call(fleet, "DELETE", "/admin/api/placement/workers/a")
    assert status == 200 and body["removed"] is True and body["source"] == "config" and body["rules"] == SEED
    assert "a" not in json.loads(overrides_file(fleet).read_text())["workers"]
    assert "gemma4:latest" in {m.model for m in (await client.list()).models}
    status, body = await call(fleet, "DELETE", "/admin/api/placement/workers/a")
    assert status == 200 and body["removed"] is False


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "fragment"),
    [
        ("PUT", "/admin/api/placement/workers/a", {"mode": "deny"}, 422, "mode must be"),
        ("PUT", "/admin/api/placement/workers/a", {"allowed_models": ["ge*ma"]}, 422, "last character"),
        ("PUT", "/admin/api/placement/workers/a", {"allowed_models": "x"}, 422, "list of strings"),
        ("PUT", "/admin/api/placement/workers/a", {"mode": "whitelist", "extra": 1}, 422, "unknown field"),
        ("PUT", "/admin/api/placement/workers/a", [], 422, "expected an object"),
        ("PUT", "/admin/api/placement/workers/zz", {"mode": "whitelist"}, 404, 'unknown worker "zz"'),
        ("POST", "/admin/api/placement/workers/a/toggle", {"model": "gemma4:*"}, 422, "exact model name"),
        ("POST", "/admin/api/placement/workers/a/toggle", {}, 422, '"model" is required'),
        ("POST", "/admin/api/placement/workers/zz/toggle", {"model": "x"}, 404, "unknown worker"),
        ("DELETE", "/admin/api/placement/workers/zz", None, 404, "unknown worker"),
    ],
)
async def test_invalid_requests_write_nothing(
    fleet: Gateway, method: str, path: str, body: Any, status: int, fragment: str
) -> None:
    got, reply = await call(fleet, method, path, body)
    assert got == status and fragment in reply["error"]["message"]
    assert not overrides_file(fleet).exists()


async def test_broken_file_while_running(fleet: Gateway) -> None:
    await call(fleet, "POST", "/admin/api/placement/workers/b/toggle", {"model": "gemma4:2b"})
    good = overrides_file(fleet).read_text()
    overrides_file(fleet).write_text('{"version": 1, "workers": {"a": {"mode": "sometimes"}}}')
    _, matrix = await call(fleet, "GET", "/admin/api/placement")
    assert "mode must be" in matrix["override_file"]["error"]
    b = {w["name"]: w for w in matrix["workers"]}["b"]
    assert b["source"] == "override" and b["cells"]["gemma4:2b"]["allowed"] is False  # last good kept whole
    status, body = await call(fleet, "POST", "/admin/api/placement/workers/a/toggle", {"model": "qwen3:8b"})
    assert status == 409 and "refusing to overwrite" in body["error"]["message"]
    assert "sometimes" in overrides_file(fleet).read_text()  # the hand edit is not lost
    overrides_file(fleet).write_text(good)
    os.utime(overrides_file(fleet), ns=(1, 1))  # make the change visible even within one mtime tick
    _, matrix = await call(fleet, "GET", "/admin/api/placement")
    assert matrix["override_file"]["error"] is None


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"version": 2, "workers": {}}', b'{"workers": {"a": {"allowed_models": ["a*b"]}}}', b"[]"],
)
async def test_broken_file_at_start_refuses(
    emulator: EmulatorFactory, gateway: GatewayFactory, tmp_path: Path, content: bytes
) -> None:
    data = tmp_path / "data0"
    data.mkdir()
    (data / "model-placement.json").write_bytes(content)
    emu = await emulator("a")
    with pytest.raises(PlacementFileError, match=r"model-placement\.json"):
        await gateway([worker("a", emu.url)])
    assert (data / "model-placement.json").read_bytes() == content


async def test_inventory_is_unfiltered(fleet: Gateway) -> None:
    status, body = await call(fleet, "GET", "/admin/api/inventory")
    assert status == 200
    a = {w["name"]: w for w in body["workers"]}["a"]
    assert a["installed"] == ["gemma4:2b", "gemma4:latest", "qwen3:8b"] and a["loaded"] == ["gemma4:latest"]
    assert a["healthy"] is True and a["inventory_known"] is True
