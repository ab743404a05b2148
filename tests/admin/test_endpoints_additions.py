"""Endpoint API additions for the UI: one endpoint, dry-run test, opt-in state, 409, since times,
fallback counts, ETag / If-Match, removing revokes the endpoint's keys."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from tests.conftest import EmulatorFactory, Gateway, GatewayFactory, free_port, worker
from turnout.fleet.endpoints import url_private
from turnout.gateway.keys import ENDPOINTS

PRIVATE_OK = {"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true"}


async def call(
    gw: Gateway, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None, key: str = ""
) -> tuple[int, Any, CIMultiDict[str]]:
    sent = {"Authorization": f"Bearer {key}"} if key else gw.admin_headers
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{gw.url}{path}", json=body, headers={**sent, **(headers or {})}) as resp,
    ):
        return resp.status, await resp.json(), CIMultiDict(resp.headers)


async def register(gw: Gateway, name: str, url: str, **extra: Any) -> dict[str, Any]:
    status, reg, _ = await call(
        gw, "POST", "/admin/api/endpoints", {"name": name, "url": url, "api": "ollama", **extra}
    )
    assert status == 201, reg
    return reg


async def test_get_one_with_since_times_and_etag(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    mac = await emulator("mac", ["llama3.2:latest"])
    gw = await gateway([], env=PRIVATE_OK)
    started = time.time()
    reg = await register(gw, "mac", mac.url)
    status, view, headers = await call(gw, "GET", "/admin/api/endpoints/mac")
    assert status == 200 and headers["ETag"] == view["etag"] == reg["endpoint"]["etag"]
    assert view["state"] == "online" and view["private_networks_allowed"] is True
    assert started <= view["state_since"] <= time.time() and view["last_online"] >= view["state_since"]
    assert view["fallbacks"] == {"total": 0, "since": 0} and view["url_private"] is True
    assert view["last_failure"] is None and view["hint_field"] is None
    online_since = view["state_since"]
    port = mac.port
    await mac.stop()
    await gw.app[ENDPOINTS].check("mac")
    _, down, _ = await call(gw, "GET", "/admin/api/endpoints/mac")
    assert down["state"] == "unreachable" and down["state_since"] > online_since
    assert down["last_online"] == view["last_online"]  # the last check that found it online
    assert down["last_failure"] == "connect_refused" and down["hint_field"] == "url"
    assert down["etag"] == view["etag"]  # health is not part of the stored record
    await mac.start(port)
    assert (await call(gw, "GET", "/admin/api/endpoints/nope"))[0] == 404


async def test_listing_says_whether_private_networks_are_allowed(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    mac = await emulator("mac", ["llama3.2:latest"])
    gw = await gateway([])
    await register(gw, "mac", mac.url)
    _, listing, _ = await call(gw, "GET", "/admin/api/endpoints")
    assert listing["private_networks_allowed"] is False
    [entry] = listing["endpoints"]
    assert entry["url_private"] is True and entry["last_failure"] == "dial_refused_private"
    assert entry["hint_field"] == "url" and entry["etag"].startswith('"')


async def test_duplicate_name_is_409_and_changes_nothing(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    mac = await emulator("mac", ["llama3.2:latest"])
    gw = await gateway([], env=PRIVATE_OK)
    await register(gw, "mac", mac.url)
    status, body, _ = await call(
        gw, "POST", "/admin/api/endpoints", {"name": "mac", "url": "http://127.0.0.1:9", "api": "openai"}
    )
    assert status == 409 and body["error"]["code"] == "endpoint_exists" and "already exists" in body["error"]["message"]
    _, view, _ = await call(gw, "GET", "/admin/api/endpoints/mac")
    assert view["url"] == mac.url and view["api"] == "ollama"
    _, keys, _ = await call(gw, "GET", "/admin/api/keys")
    assert len(keys["keys"]) == 1  # no second key was printed


async def test_dry_run_stores_nothing(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    cloud = await emulator("cloud", ["gpt-x"], require_key="s3cret")
    gw = await gateway([worker("gpu", cloud.url)], env=PRIVATE_OK)
    base = {"url": cloud.url, "api": "ollama"}
    status, ok, _ = await call(gw, "POST", "/admin/api/endpoints/test", {**base, "credential": "s3cret"})
    assert status == 200 and ok["test"]["ok"] is True and ok["test"]["models"] == ["gpt-x"]
    assert ok["private_networks_allowed"] is True and ok["name_taken"] is None
    _, bad, _ = await call(gw, "POST", "/admin/api/endpoints/test", {**base, "credential": "wrong", "name": "gpu"})
    assert bad["test"]["failure"] == "auth" and bad["test"]["field"] == "credential" and bad["name_taken"] is True
    dead = f"http://127.0.0.1:{free_port()}"
    _, down, _ = await call(gw, "POST", "/admin/api/endpoints/test", {"url": dead, "api": "ollama", "name": "new"})
    assert down["test"]["failure"] == "connect_refused" and down["test"]["field"] == "url"
    assert "OLLAMA_HOST" in down["test"]["hint"] and down["name_taken"] is False
    status, body, _ = await call(gw, "POST", "/admin/api/endpoints/test", {"url": "ftp://x", "api": "ollama"})
    assert status == 422 and '"url"' in body["error"]["message"]
    _, listing, _ = await call(gw, "GET", "/admin/api/endpoints")
    assert listing["endpoints"] == []
    _, audit, _ = await call(gw, "GET", "/admin/api/audit")
    assert not [e for e in audit["entries"] if e["action"].startswith("endpoint.")]
    assert "s3cret" not in str(ok) + str(bad)


async def test_dry_run_private_address_without_opt_in(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    mac = await emulator("mac", ["llama3.2:latest"])
    gw = await gateway([])
    _, body, _ = await call(gw, "POST", "/admin/api/endpoints/test", {"url": mac.url, "api": "ollama"})
    assert body["test"]["failure"] == "dial_refused_private" and body["test"]["field"] == "url"
    assert body["private_networks_allowed"] is False and body["url_private"] is True
    assert "APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS=true" in body["test"]["hint"] and mac.served() == 0


async def test_if_match_on_change_and_remove(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    mac = await emulator("mac", ["llama3.2:latest"])
    gw = await gateway([], env=PRIVATE_OK)
    reg = await register(gw, "mac", mac.url)
    first = reg["endpoint"]["etag"]
    status, changed, headers = await call(
        gw, "PATCH", "/admin/api/endpoints/mac", {"latency_budget_ms": 500}, headers={"If-Match": first}
    )
    assert status == 200 and headers["ETag"] == changed["endpoint"]["etag"] != first
    status, body, headers = await call(
        gw, "PATCH", "/admin/api/endpoints/mac", {"latency_budget_ms": 900}, headers={"If-Match": first}
    )
    assert status == 412 and body["error"]["code"] == "stale_write" and headers["ETag"] == changed["endpoint"]["etag"]
    status, body, _ = await call(gw, "DELETE", "/admin/api/endpoints/mac", headers={"If-Match": first})
    assert status == 412
    _, view, _ = await call(gw, "GET", "/admin/api/endpoints/mac")
    assert view["latency_budget_ms"] == 500  # neither stale write changed anything
    status, removed, _ = await call(
        gw, "DELETE", "/admin/api/endpoints/mac", headers={"If-Match": changed["endpoint"]["etag"]}
    )
    assert status == 200 and removed["removed"] == "mac"


async def test_remove_revokes_the_printed_key_unless_kept(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    mac = await emulator("mac", ["llama3.2:latest"])
    gw = await gateway([], env=PRIVATE_OK, auth={"open": False})
    reg = await register(gw, "mac", mac.url)
    _, other, _ = await call(gw, "POST", "/admin/api/keys", {"app": "web"})
    status, removed, _ = await call(gw, "DELETE", "/admin/api/endpoints/mac")
    assert status == 200 and removed["revoked_keys"] == [reg["key_prefix"]] and removed["kept_keys"] is False
    _, keys, _ = await call(gw, "GET", "/admin/api/keys")
    states = {k["prefix"]: k["state"] for k in keys["keys"]}
    assert states == {reg["key_prefix"]: "revoked", other["record"]["prefix"]: "active"}
    _, audit, _ = await call(gw, "GET", "/admin/api/audit?action=key.revoke")
    assert [e["target"] for e in audit["entries"]] == [f"key:{reg['key_prefix']}"]
    # registered again and removed with keep_keys: the new key stays active
    again = await register(gw, "mac", mac.url)
    status, removed, _ = await call(gw, "DELETE", "/admin/api/endpoints/mac?keep_keys=true")
    assert status == 200 and removed["revoked_keys"] == [] and removed["kept_keys"] is True
    _, keys, _ = await call(gw, "GET", "/admin/api/keys")
    assert {k["prefix"]: k["state"] for k in keys["keys"]}[again["key_prefix"]] == "active"
    assert (await call(gw, "DELETE", "/admin/api/endpoints/x?keep_keys=maybe"))[0] == 422


async def test_fallback_counts(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    fleet_worker = await emulator("fleet", ["llama3.2:latest"])
    mac = await emulator("mac", ["llama3.2:latest"])
    gw = await gateway([worker("gpu", fleet_worker.url)], env=PRIVATE_OK)
    await register(gw, "mac", mac.url, fallback_model="llama3.2:latest")
    await mac.stop()
    for _ in range(2):
        status, _, _ = await call(
            gw, "POST", "/api/chat", {"model": "mac/llama3.2:latest", "messages": [], "stream": False}
        )
        assert status == 200
    _, view, _ = await call(gw, "GET", "/admin/api/endpoints/mac")
    assert view["fallbacks"] == {"total": 2, "since": 2}


@pytest.mark.parametrize(
    ("url", "private"),
    [
        ("http://127.0.0.1:11434", True),
        ("http://10.1.2.3", True),
        ("http://[::1]:8080", True),
        ("http://localhost:11434", True),
        ("http://8.8.8.8", False),
        ("http://mac-studio.lan:11434", None),
    ],
)
def test_url_private(url: str, private: bool | None) -> None:
    assert url_private(url) is private


async def test_a_url_with_its_api_suffix_is_trimmed_and_said(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    mac = await emulator("mac", ["llama3.2:latest"])
    gw = await gateway([worker("box", f"http://127.0.0.1:{free_port()}")], env=PRIVATE_OK)
    status, dry, _ = await call(gw, "POST", "/admin/api/endpoints/test", {"url": f"{mac.url}/api/", "api": "ollama"})
    assert status == 200 and dry["test"]["ok"] and dry["url"] == mac.url
    assert dry["url_note"] == f"using {mac.url} (dropped /api/)"
    reg = await register(gw, "mac", f"{mac.url}/api")
    assert reg["endpoint"]["url"] == mac.url and reg["url_note"] == f"using {mac.url} (dropped /api)"
    assert reg["test"]["ok"]
    status, changed, _ = await call(gw, "PATCH", "/admin/api/endpoints/mac", {"url": f"{mac.url}/v1"})
    assert status == 200 and changed["endpoint"]["url"] == mac.url and "(dropped /v1)" in changed["url_note"]
    status, same, _ = await call(gw, "PATCH", "/admin/api/endpoints/mac", {"latency_budget_ms": 5})
    assert status == 200 and same["url_note"] is None
    # the one name rule: a configured worker's name is refused (and said taken by the dry run)
    status, body, _ = await call(gw, "POST", "/admin/api/endpoints", {"name": "box", "url": mac.url})
    assert status == 422 and body["error"]["field"] == "name" and "configured worker" in body["error"]["message"]
    _, dry, _ = await call(gw, "POST", "/admin/api/endpoints/test", {"url": mac.url, "name": "box"})
    assert dry["name_taken"] is True


async def test_registration_audits_its_key_and_a_new_credential_as_replaced(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    mac = await emulator("mac", ["llama3.2:latest"])
    gw = await gateway([], env=PRIVATE_OK)
    reg = await register(gw, "mac", mac.url, credential="first-secret")
    _, audit, _ = await call(gw, "GET", "/admin/api/audit?action=key.create")
    [created] = audit["entries"]
    assert created["target"] == f"key:{reg['key_prefix']}" and created["after"]["app"] == "endpoint-mac"
    assert (await call(gw, "PATCH", "/admin/api/endpoints/mac", {"credential": "second-secret"}))[0] == 200
    assert (await call(gw, "PATCH", "/admin/api/endpoints/mac", {"credential": None}))[0] == 200
    _, audit, _ = await call(gw, "GET", "/admin/api/audit?action=endpoint.change")
    removed, replaced = audit["entries"]
    assert replaced["before"]["credential"] is True and replaced["after"]["credential"] == "replaced"
    assert removed["before"]["credential"] is True and removed["after"]["credential"] is False
    assert "secret" not in str(audit)
