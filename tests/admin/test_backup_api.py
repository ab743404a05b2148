"""Admin API for persistence, backup download and restore upload, against a running gateway."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import zipfile
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import EmulatorFactory, Gateway, GatewayFactory, worker
from turnout.admin import backup_api

CHAT = {"model": "qwen3:8b", "messages": [], "stream": False}
OVERRIDE = {"mode": "whitelist", "allowed_models": ["qwen3:8b"], "denied_models": []}


async def call(gw: Gateway, method: str, path: str, body: Any = None, key: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else gw.admin_headers
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{gw.url}{path}", json=body, headers=headers) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


async def download(gw: Gateway, query: str = "") -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{gw.url}/admin/api/backup{query}", headers=gw.admin_headers) as r,
    ):
        return r.status, dict(r.headers), await r.read()


async def upload(gw: Gateway, data: bytes | aiohttp.FormData, **headers: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/admin/api/backup/restore", data=data, headers={**gw.admin_headers, **headers}) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


@pytest.fixture
async def gw(emulator: EmulatorFactory, gateway: GatewayFactory) -> Gateway:
    emu = await emulator("a", ["qwen3:8b", "llama3.2:latest"])
    return await gateway([worker("a", emu.url)], auth={"open": False})


async def test_persistence_lists_every_state_file(gw: Gateway) -> None:
    status, body = await call(gw, "GET", "/admin/api/persistence")
    assert status == 200 and body["store"] == "sqlite" and body["data_dir"] == str(gw.data_dir)
    entries = {e["id"]: e for e in body["entries"]}
    assert set(entries) == {"config", "model_placement", "database", "secret_key", "admin_token"}
    assert entries["config"]["path"] == str(gw.settings.config_path) and entries["config"]["size"] > 0
    assert entries["config"]["backup"] == "included" and entries["config"]["modified_at"] is not None
    placement = entries["model_placement"]
    assert placement["exists"] is False and placement["size"] is None and placement["modified_at"] is None
    assert entries["database"]["path"] == str(gw.data_dir / "turnout.db") and entries["database"]["size"] > 0
    assert entries["secret_key"]["backup"] == "optional" and entries["admin_token"]["backup"] == "excluded"
    await call(gw, "PUT", "/admin/api/placement/workers/a", OVERRIDE)
    _, body = await call(gw, "GET", "/admin/api/persistence")
    placement = next(e for e in body["entries"] if e["id"] == "model_placement")
    assert placement["exists"] is True and placement["size"] > 0 and placement["modified_at"] > 0


async def test_persistence_with_pools_and_postgres(
    emulator: EmulatorFactory, gateway: GatewayFactory, postgres_database: str
) -> None:
    gw = await gateway(
        [],
        auth={"open": False},
        storage={"database_url": postgres_database.replace("postgres@", "postgres:pw@")},
        pools={"agents": [{"name": "gpu-0", "agent_url": "http://127.0.0.1:9"}], "interval_s": 3600},
    )
    _, body = await call(gw, "GET", "/admin/api/persistence")
    entries = {e["id"]: e for e in body["entries"]}
    db = entries["database"]
    assert db["kind"] == "postgresql" and db["size"] > 0 and "pw" not in db["path"]
    assert db["path"].startswith("postgresql://postgres@127.0.0.1:")
    assert entries["claims"]["backup"] == "included" and entries["claim_status"]["backup"] == "excluded"
    registry = entries["engine_registry:gpu-0"]
    assert registry["path"] == "http://127.0.0.1:9" and registry["backup"] == "excluded"
    # a PostgreSQL round trip through the running gateway
    _, created = await call(gw, "POST", "/admin/api/keys", {"app": "web", "models": ["*"]})
    _, _, data = await download(gw)
    assert (await call(gw, "POST", f"/admin/api/keys/{created['key'][:10]}/revoke"))[0] == 200
    status, body = await upload(gw, data)
    assert status == 200, body
    assert body["rows"]["keys"] == 1 and "store (PostgreSQL)" in body["restored"]
    _, keys = await call(gw, "GET", "/admin/api/keys")
    assert [k["revoked_at"] for k in keys["keys"]] == [None]


async def test_download_then_restore_through_the_api(gw: Gateway) -> None:
    _, created = await call(gw, "POST", "/admin/api/keys", {"app": "web", "models": ["*"]})
    key = created["key"]
    assert (await call(gw, "PUT", "/admin/api/placement/workers/a", OVERRIDE))[0] == 200

    status, headers, data = await download(gw)
    assert status == 200 and headers["Content-Type"] == "application/zip"
    assert headers["Content-Disposition"].startswith('attachment; filename="turnout-backup-')
    assert headers["Cache-Control"] == "no-store"
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert "secret.key" not in archive.namelist() and "model-placement.json" in archive.namelist()
        assert json.loads(archive.read("manifest.json"))["secret_key_included"] is False

    # the state moves on: the key is revoked, the override deleted, a second key made
    assert (await call(gw, "POST", f"/admin/api/keys/{key[:10]}/revoke"))[0] == 200
    assert (await call(gw, "DELETE", "/admin/api/placement/workers/a"))[0] == 200
    _, later = await call(gw, "POST", "/admin/api/keys", {"app": "late", "models": ["*"]})
    assert (await call(gw, "POST", "/v1/chat/completions", CHAT, key=key))[0] == 401

    status, body = await upload(gw, data, **{"Content-Type": "application/zip"})
    assert status == 200, body
    assert body["restart_required"] is False and body["config_changed"] is False
    assert "model-placement.json" in body["restored"] and "config.json" in body["unchanged"]
    # live at once, no restart: the key works again, the late one is gone, the override is back
    assert (await call(gw, "POST", "/v1/chat/completions", CHAT, key=key))[0] == 200
    assert (await call(gw, "POST", "/v1/chat/completions", CHAT, key=later["key"]))[0] == 401
    blocked = {**CHAT, "model": "llama3.2:latest"}
    assert (await call(gw, "POST", "/v1/chat/completions", blocked, key=key))[0] == 403
    _, audit = await call(gw, "GET", "/admin/api/audit?action=backup.restore")
    assert len(audit["entries"]) == 1 and audit["entries"][0]["after"]["restored"] == body["restored"]
    # the audit log is append-only: what happened after the backup stays on record
    _, audit = await call(gw, "GET", "/admin/api/audit")
    actions = [e["action"] for e in audit["entries"]]
    assert actions[:5] == ["backup.restore", "key.create", "placement.delete", "key.revoke", "backup.create"]


async def test_the_secret_key_only_on_request(gw: Gateway) -> None:
    status, _, data = await download(gw, "?include_secret_key=true")
    assert status == 200
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.read("secret.key").strip() == (gw.data_dir / "secret.key").read_bytes().strip()
    status, body = await call(gw, "GET", "/admin/api/backup?include_secret_key=maybe")
    assert status == 422 and "include_secret_key" in body["error"]["message"]
    status, body = await call(gw, "GET", "/admin/api/backup?secret=1")
    assert status == 422


async def test_a_config_change_needs_a_restart(gw: Gateway) -> None:
    _, _, data = await download(gw)
    config = gw.settings.config_path
    assert config is not None
    raw = json.loads(config.read_text())
    config.write_text(json.dumps({**raw, "workers": []}))
    form = aiohttp.FormData()
    form.add_field("backup", data, filename="b.zip", content_type="application/zip")
    status, body = await upload(gw, form)
    assert status == 200, body
    assert body["config_changed"] is True and body["restart_required"] is True
    assert "config.json" in body["restart_reasons"][0]
    assert json.loads(config.read_text())["workers"][0]["name"] == "a"


@pytest.mark.parametrize(
    ("data", "status", "code", "message"),
    [
        (b"not a zip", 400, "invalid_backup", "not a ZIP file"),
        (b"", 400, "invalid_backup", "no body"),
        ("foreign", 400, "invalid_backup", "no manifest.json"),
    ],
)
async def test_bad_uploads_change_nothing(gw: Gateway, data: Any, status: int, code: str, message: str) -> None:
    await call(gw, "PUT", "/admin/api/placement/workers/a", OVERRIDE)
    if data == "foreign":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr("hello.txt", "hi")
        data = buffer.getvalue()
    before = (gw.data_dir / "model-placement.json").read_bytes()
    got, body = await upload(gw, data)
    assert got == status and body["error"]["code"] == code and message in body["error"]["message"]
    assert "nothing was changed" in body["error"]["message"] or code != "invalid_backup" or not data
    assert (gw.data_dir / "model-placement.json").read_bytes() == before
    assert [p.name for p in gw.data_dir.iterdir() if p.name.startswith(".")] == []


async def test_the_upload_is_bounded(gw: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, data = await download(gw)
    monkeypatch.setattr(backup_api, "MAX_UPLOAD_BYTES", 1000)
    status, body = await upload(gw, data)
    assert status == 413 and body["error"]["code"] == "payload_too_large"

    async def chunks() -> Any:
        yield data  # no Content-Length: counted as it arrives

    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/admin/api/backup/restore", data=chunks(), headers=gw.admin_headers) as resp,
    ):
        assert resp.status == 413
    assert [p.name for p in gw.data_dir.iterdir() if p.name.startswith(".")] == []


async def test_the_routes_need_the_admin_token(gw: Gateway) -> None:
    for method, path in (("GET", "/admin/api/persistence"), ("GET", "/admin/api/backup")):
        status, _ = await call(gw, method, path, key="wrong")
        assert status == 401
    status, _ = await call(gw, "POST", "/admin/api/backup/restore", key="wrong")
    assert status == 401


async def test_a_restored_secret_key_needs_a_restart(gw: Gateway) -> None:
    _, _, data = await download(gw, "?include_secret_key=1")
    key_file = gw.data_dir / "secret.key"
    original = key_file.read_bytes()
    key_file.write_bytes(b"Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmE=\n")
    status, body = await upload(gw, data)
    assert status == 200, body
    assert body["secret_key_changed"] is True and body["restart_required"] is True
    assert any("secret.key" in reason for reason in body["restart_reasons"])
    assert key_file.read_bytes() == original and oct(key_file.stat().st_mode & 0o777) == "0o600"


async def test_a_download_cancelled_while_its_file_opens_closes_the_file(tmp_path, monkeypatch) -> None:
    """The open runs in a thread and cannot be cancelled: when the client leaves during it, the file it opened
    is closed once the thread is done, not dropped unclosed (a ResourceWarning, and an fd until collected)."""
    path = tmp_path / "backup.zip"
    path.write_bytes(b"zip")
    opened: list[Any] = []
    release = threading.Event()
    real_open = Path.open

    def slow_open(self: Path, *args: Any, **kwargs: Any) -> Any:
        release.wait(10)
        opened.append(real_open(self, *args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(Path, "open", slow_open)
    task = asyncio.ensure_future(backup_api._open_for_reading(path))
    await asyncio.sleep(0.05)
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):  # bounded: the thread's result reaches the loop within a few iterations
        if opened and opened[0].closed:
            break
        await asyncio.sleep(0.01)
    assert opened and opened[0].closed
