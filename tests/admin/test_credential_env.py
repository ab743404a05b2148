"""An endpoint credential named by a variable of the gateway's own environment ("credential_env"): the
form in a browser names a secret that lives only on the control plane."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.conftest import EmulatorFactory, Gateway, GatewayFactory

ENV = {"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true", "MAC_KEY": "sk-mac-secret"}


async def admin(gw: Gateway, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{gw.url}{path}", json=body, headers=gw.admin_headers) as r,
    ):
        return r.status, await r.json()


async def test_register_test_and_change_with_a_variable(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    mac = await emulator("mac", ["llama3.2:latest"], require_key="sk-mac-secret")
    gw = await gateway([], env=ENV)
    status, dry = await admin(
        gw, "POST", "/admin/api/endpoints/test", {"url": mac.url, "api": "ollama", "credential_env": "MAC_KEY"}
    )
    assert status == 200 and dry["test"]["ok"] is True
    status, reg = await admin(
        gw,
        "POST",
        "/admin/api/endpoints",
        {"name": "mac", "url": mac.url, "api": "ollama", "credential_env": "MAC_KEY"},
    )
    assert status == 201 and reg["test"]["ok"] is True and reg["endpoint"]["credential"] is True
    assert "sk-mac-secret" not in str(reg)
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{gw.url}/api/chat",
            json={"model": "mac/llama3.2", "messages": [], "stream": False},
            headers={"Authorization": f"Bearer {reg['key']}"},
        ) as r,
    ):
        assert r.status == 200  # the stored (encrypted) value reached the server as its Bearer token
    status, changed = await admin(gw, "PATCH", "/admin/api/endpoints/mac", {"credential_env": "MAC_KEY"})
    assert status == 200 and changed["endpoint"]["credential"] is True


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"credential_env": "NOT_SET_ANYWHERE"}, "NOT_SET_ANYWHERE is not set in the gateway's environment"),
        ({"credential_env": "bad name"}, "credential_env"),
        ({"credential_env": "MAC_KEY", "credential": "x"}, "not both"),
    ],
)
async def test_bad_variables_store_nothing(gateway: GatewayFactory, body: dict[str, Any], fragment: str) -> None:
    gw = await gateway([], env=ENV)
    status, reply = await admin(
        gw, "POST", "/admin/api/endpoints", {"name": "mac", "url": "http://127.0.0.1:9", **body}
    )
    assert status == 422 and fragment in reply["error"]["message"]
    _, listing = await admin(gw, "GET", "/admin/api/endpoints")
    assert listing["endpoints"] == []
