"""The client APIs a worker or an endpoint serves itself (``native_apis``): declared in the config or through the
admin API and the CLI, validated the same way everywhere, kept in the store, and on the fleet's worker state (where
the dialects read them to pass a call through unchanged instead of translating it)."""

from __future__ import annotations

import json
import subprocess
import typing
from pathlib import Path

import pytest

from tests.admin.test_endpoints_additions import PRIVATE_OK, call, register
from tests.conftest import EmulatorFactory, GatewayFactory, worker
from tests.support.cli import TURNOUT
from turnout.config import ConfigError, NativeApi, load_settings
from turnout.dialects.base import NATIVE_APIS
from turnout.gateway.keys import FLEET


def test_the_config_and_the_dialects_name_the_same_native_apis() -> None:
    assert typing.get_args(NativeApi) == NATIVE_APIS


@pytest.mark.parametrize(
    ("apis", "stored"),
    [([], []), (["anthropic"], ["anthropic"]), (["responses", "anthropic", "responses"], ["anthropic", "responses"])],
)
def test_a_config_worker_declares_them(tmp_path: Path, apis: list[str], stored: list[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"workers": [{"name": "a", "url": "http://127.0.0.1:1", "native_apis": apis}]}))
    assert load_settings(path, env={}).workers[0].native_apis == stored


def test_an_unknown_native_api_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"workers": [{"name": "a", "url": "http://127.0.0.1:1", "native_apis": ["gemini"]}]}))
    with pytest.raises(ConfigError, match=r"workers\[0\]\.native_apis\[0\]"):
        load_settings(path, env={})


async def test_config_workers_and_endpoints_carry_them_on_their_state(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    local = await emulator("local", ["m:latest"])
    mac = await emulator("mac", ["llama3.2:latest"])
    gw = await gateway([worker("local", local.url, native_apis=["responses"])], env=PRIVATE_OK)
    fleet = gw.app[FLEET]
    assert fleet.workers["local"].native_apis == {"responses"}
    reg = await register(gw, "mac", mac.url, native_apis=["anthropic"])
    assert reg["endpoint"]["native_apis"] == ["anthropic"]
    assert fleet.workers["mac"].native_apis == {"anthropic"}
    status, changed, _ = await call(
        gw, "PATCH", "/admin/api/endpoints/mac", {"native_apis": ["responses", "anthropic"]}, headers={"If-Match": "*"}
    )
    assert status == 200, changed
    assert changed["endpoint"]["native_apis"] == ["anthropic", "responses"]
    assert fleet.workers["mac"].native_apis == {"anthropic", "responses"}
    status, changed, _ = await call(gw, "PATCH", "/admin/api/endpoints/mac", {"native_apis": []})
    assert status == 200 and changed["endpoint"]["native_apis"] == [] and not fleet.workers["mac"].native_apis
    status, refused, _ = await call(gw, "PATCH", "/admin/api/endpoints/mac", {"native_apis": ["gemini"]})
    assert status == 422 and refused["error"]["field"].startswith("native_apis"), refused
    status, inventory, _ = await call(gw, "GET", "/admin/api/inventory")
    assert {w["name"]: w["native_apis"] for w in inventory["workers"]} == {"local": ["responses"], "mac": []}


def test_the_cli_sets_them_on_the_store(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"storage": {"data_dir": "data"}, "listen": {"port": 1}, "workers": []}))

    def turnout(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*TURNOUT, *args, "--config", str(config)], capture_output=True, text=True, timeout=60, cwd=tmp_path
        )

    added = turnout(
        "endpoint", "add", "mac", "--url", "http://192.0.2.1:11434", "--api", "ollama", "--native-api", "anthropic"
    )
    assert added.returncode == 0, added.stderr
    changed = turnout("endpoint", "set", "mac", "--native-api", "responses", "--native-api", "anthropic")
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout)["native_apis"] == ["anthropic", "responses"]
    cleared = turnout("endpoint", "set", "mac", "--native-api", "none")
    assert json.loads(cleared.stdout)["native_apis"] == []
    bad = turnout("endpoint", "set", "mac", "--native-api", "gemini")
    assert bad.returncode == 2 and bad.stderr.startswith("turnout: --native-api"), bad.stderr
