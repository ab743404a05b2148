"""Backups and restores end to end: real gateways, real SQLite and PostgreSQL stores, real ZIP files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import ADMIN_TOKEN, EmulatorFactory, Gateway, GatewayFactory, serve_gateway, worker
from turnout.config import load_settings
from turnout.controller.local import ClaimFiles
from turnout.state import restore as restore_module
from turnout.state.backup import (
    BackupError,
    BackupInvalid,
    BackupRefused,
    create_backup,
    open_backup,
)
from turnout.state.restore import restore_backup
from turnout.state.running import GatewayMark
from turnout.state.store_export import StoreExportError
from turnout.store.audit import AuditLog
from turnout.store.db import Database, database_url
from turnout.store.keys import KeyStore
from turnout.wiring import create_app

PRIVATE_OK = {"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true"}
NOW = 1_800_000_000.0


async def call(url: str, method: str, path: str, body: Any = None, key: str = ADMIN_TOKEN) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{url}{path}", json=body, headers={"Authorization": f"Bearer {key}"}) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False}


def snapshot(*roots: Path) -> dict[str, str]:
    """Every file under ``roots`` with its SHA-256 (the state a failed restore must leave as it was)."""
    out = {}
    for root in roots:
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for p in paths:
            if p.name.endswith(("-wal", "-shm")) or p.name in ("gateway.lock", "model-placement.json.lock"):
                continue
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def db_dump(url: str) -> dict[str, list[Any]]:
    db = Database(database_url(url, Path("/nonexistent")))
    try:
        with db.engine.connect() as conn:
            return {
                t: sorted(map(str, conn.exec_driver_sql(f"SELECT * FROM {t}").all()))
                for t in ("keys", "apps", "tenants", "endpoints", "audit")
            }
    finally:
        db.close()


async def start(config: Path, env: dict[str, str]) -> tuple[str, Any]:
    """A new gateway app on the config file as it is now (what a restart would run)."""
    app = create_app(load_settings(config, env=env), admin_token=ADMIN_TOKEN)
    return await serve_gateway(app)


async def populate(gw: Gateway, cloud_url: str) -> str:
    """A key, a placement override and an endpoint with a credential; returns the key."""
    status, created = await call(gw.url, "POST", "/admin/api/keys", {"app": "web", "models": ["*"]})
    assert status == 201, created
    override = {"mode": "whitelist", "allowed_models": ["qwen3:8b"], "denied_models": []}
    status, body = await call(gw.url, "PUT", "/admin/api/placement/workers/a", override)
    assert status == 200, body
    status, body = await call(
        gw.url,
        "POST",
        "/admin/api/endpoints",
        {"name": "cloud", "url": cloud_url, "api": "openai", "credential": "s3cret-upstream"},
    )
    assert status == 201, body
    return str(created["key"])


async def check_serves(url: str, key: str) -> None:
    status, body = await call(url, "POST", "/v1/chat/completions", chat("qwen3:8b"), key=key)
    assert status == 200, body
    status, body = await call(url, "POST", "/v1/chat/completions", chat("llama3.2:latest"), key=key)
    assert status == 403, body  # blocked by the restored override
    _, placement = await call(url, "GET", "/admin/api/placement")
    assert json.dumps(placement).count("qwen3:8b") and "whitelist" in json.dumps(placement)
    status, body = await call(url, "POST", "/v1/chat/completions", chat("cloud/gpt-x"), key=key)
    assert status == 200, body  # the endpoint's credential decrypts and reaches the upstream
    _, listing = await call(url, "GET", "/admin/api/endpoints")
    assert [e["name"] for e in listing["endpoints"]] == ["cloud"] and listing["endpoints"][0]["credential"] is True


@pytest.mark.parametrize("wipe", [True, False], ids=["wiped", "changed"])
async def test_a_gateway_restarted_on_a_restored_backup_serves_the_same_state(
    emulator: EmulatorFactory, gateway: GatewayFactory, database_url: str, tmp_path: Path, wipe: bool
) -> None:
    fleet = await emulator("a", ["qwen3:8b", "llama3.2:latest"])
    cloud = await emulator("cloud", ["gpt-x"], require_key="s3cret-upstream")
    gw = await gateway([worker("a", fleet.url)], env=PRIVATE_OK, auth={"open": False}, storage={})
    # the fixture's storage names data_dir; put the store where the parameter says
    config = gw.settings.config_path
    assert config is not None
    raw = json.loads(config.read_text())
    raw["storage"] = {"data_dir": str(gw.data_dir), "database_url": database_url}
    config.write_text(json.dumps(raw))
    await gw.stop()
    url, runner = await start(config, PRIVATE_OK)
    try:
        key = await populate(Gateway(url, runner.app, gw.settings, gw.data_dir, runner), cloud.url)
        await check_serves(url, key)
        settings = load_settings(config, env=PRIVATE_OK)
        zip_path = tmp_path / "backup.zip"
        created = create_backup(settings, zip_path, include_secret_key=wipe, now=NOW)  # while it runs
        assert created.manifest.store == ("sqlite" if database_url.startswith("sqlite") else "postgresql")
        with zipfile.ZipFile(zip_path) as archive:  # the credential is in it, encrypted only
            assert all(b"s3cret-upstream" not in archive.read(n) for n in archive.namelist())
        if not wipe:  # change everything the backup holds
            assert (await call(url, "POST", f"/admin/api/keys/{key[:10]}/revoke"))[0] == 200
            assert (await call(url, "DELETE", "/admin/api/placement/workers/a"))[0] == 200
            assert (await call(url, "DELETE", "/admin/api/endpoints/cloud"))[0] == 200
    finally:
        await runner.cleanup()
    if wipe:  # restoring onto a machine that has nothing yet: the backup's config is used as it is
        _wipe(gw.data_dir, config, database_url)
    result = restore_backup(zip_path, config, env=PRIVATE_OK)
    assert result.restored and not any("another secret key" in w for w in result.warnings)
    url, runner = await start(config, PRIVATE_OK)
    try:
        await check_serves(url, key)
    finally:
        await runner.cleanup()


def _wipe(data_dir: Path, config: Path, url: str) -> None:
    shutil.rmtree(data_dir)
    config.unlink()
    if url.startswith("sqlite"):
        for suffix in ("", "-wal", "-shm"):
            Path(url.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)
        return
    db = Database(url)
    with db.engine.begin() as conn:
        conn.exec_driver_sql("DROP SCHEMA public CASCADE")
        conn.exec_driver_sql("CREATE SCHEMA public")
    db.close()


# -- a small state without a gateway -----------------------------------------------------------------


def make_state(tmp_path: Path, *, database: str | None = None, agents: bool = True) -> Path:
    """A config, a migrated store with one key, an override file and two claims; returns the config path."""
    config = tmp_path / "etc" / "config.json"
    config.parent.mkdir(parents=True)
    raw: dict[str, Any] = {"storage": {"data_dir": "../data"}, "workers": [{"name": "a", "url": "http://127.0.0.1:1"}]}
    if database:
        raw["storage"]["database_url"] = database
    if agents:
        raw["pools"] = {"agents": [{"name": "gpu-0", "agent_url": "http://127.0.0.1:1"}]}
    config.write_text(json.dumps(raw, indent=2))
    settings = load_settings(config, env={})
    db = Database(database_url(settings.storage.database_url, settings.data_dir))
    db.migrate()
    KeyStore(db).create(app="web", tenant=None, scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=NOW)
    db.close()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    settings.placement_file.write_text(json.dumps({"version": 1, "workers": {"a": {"mode": "whitelist"}}}))
    files = ClaimFiles(settings.data_dir)
    for name in ("small", "big"):
        files.apply({"metadata": {"name": name}, "spec": {"modelName": f"org/{name}"}})
    (settings.data_dir / "secret.key").write_bytes(b"cw_0x689RpI-jtRR7oE8h9Tg3bmVD8MhlC3OLBOgBHU=\n")
    return config


def app_count(config: Path) -> int:
    settings = load_settings(config, env={})
    db = Database(database_url(settings.storage.database_url, settings.data_dir))
    try:
        return len(KeyStore(db).all())
    finally:
        db.close()


def test_the_zip_holds_what_the_manifest_says(tmp_path: Path) -> None:
    config = make_state(tmp_path)
    out = tmp_path / "b.zip"
    created = create_backup(load_settings(config, env={}), out, now=NOW)
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    with zipfile.ZipFile(out) as archive:
        names = sorted(archive.namelist())
        manifest = json.loads(archive.read("manifest.json"))
        for entry in manifest["files"]:
            data = archive.read(entry["path"])
            assert len(data) == entry["size"] and hashlib.sha256(data).hexdigest() == entry["sha256"]
    assert names == sorted(
        [
            "manifest.json",
            "config.json",
            "model-placement.json",
            "store/turnout.db",
            "claims/big.json",
            "claims/small.json",
        ]
    )
    assert manifest["format"] == "turnout-backup" and manifest["turnout_version"]
    assert manifest["schema_revision"] == created.manifest.schema_revision and manifest["store"] == "sqlite"
    assert manifest["secret_key_included"] is False and len(manifest["secret_key_fingerprint"]) == 16
    assert manifest["created_at"] == "2027-01-15T08:00:00Z" and manifest["claims_included"] is True
    with_key = create_backup(load_settings(config, env={}), tmp_path / "k.zip", include_secret_key=True, now=NOW)
    assert with_key.manifest.secret_key_included and with_key.manifest.file("secret.key") is not None


def test_restore_replaces_the_state_and_claims_follow_the_backup(tmp_path: Path) -> None:
    config = make_state(tmp_path)
    settings = load_settings(config, env={})
    out = tmp_path / "b.zip"
    create_backup(settings, out, now=NOW)
    files = ClaimFiles(settings.data_dir)
    files.mark_deleted("small")
    (files.dir / "big.json").unlink()
    files.apply({"metadata": {"name": "extra"}, "spec": {"modelName": "org/extra"}})
    settings.placement_file.unlink()
    db = Database(database_url(None, settings.data_dir))
    KeyStore(db).create(app="late", tenant=None, scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=NOW)
    db.close()
    assert app_count(config) == 2
    result = restore_backup(out, config, env={})
    assert sorted(p.name for p in files.dir.iterdir()) == ["big.json", "small.json"]
    assert not any(d.get("deleting") for d in files.all())
    assert settings.placement_file.exists() and app_count(config) == 1
    assert "claims/extra.json" in result.removed and "config.json" in result.unchanged
    assert not result.config_changed and not result.secret_key_changed
    leftovers = [p for p in settings.data_dir.rglob(".*") if p.name != ".gitkeep"]
    assert leftovers == []  # no staged or old copies left behind


BAD_ZIPS: list[tuple[str, Callable[[dict[str, bytes], dict[str, Any]], None], str]] = []


def _bad(name: str, message: str) -> Callable[..., Any]:
    def register(edit: Callable[[dict[str, bytes], dict[str, Any]], None]) -> Any:
        BAD_ZIPS.append((name, edit, message))
        return edit

    return register


@_bad("checksum", "SHA-256 or size does not match")
def _checksum(members: dict[str, bytes], manifest: dict[str, Any]) -> None:
    data = bytearray(members["config.json"])
    data[0:1] = b" "
    members["config.json"] = bytes(data)


@_bad("extra member", "not listed in the manifest")
def _extra(members: dict[str, bytes], manifest: dict[str, Any]) -> None:
    members["claims/sneaky.json"] = b"{}"


@_bad("missing member", "lacks files its manifest lists")
def _missing(members: dict[str, bytes], manifest: dict[str, Any]) -> None:
    del members["model-placement.json"]


@_bad("dotdot", "escapes the data dir")
def _dotdot(members: dict[str, bytes], manifest: dict[str, Any]) -> None:
    members["claims/../../etc/evil.json"] = b"{}"
    manifest["files"].append({"path": "claims/../../etc/evil.json", "size": 2, "sha256": "0" * 64})


@_bad("absolute", "absolute path")
def _absolute(members: dict[str, bytes], manifest: dict[str, Any]) -> None:
    members["/etc/evil"] = b"x"


@_bad("foreign manifest", "not a Turnout backup")
def _foreign(members: dict[str, bytes], manifest: dict[str, Any]) -> None:
    manifest["format"] = "someone-else"


@_bad("no manifest", "no manifest.json")
def _no_manifest(members: dict[str, bytes], manifest: dict[str, Any]) -> None:
    manifest.clear()


@_bad("unknown revision", "schema revision '9999' (Turnout 0.1.0) is unknown")
def _revision(members: dict[str, bytes], manifest: dict[str, Any]) -> None:
    manifest["schema_revision"] = "9999"


@_bad("invalid config", "config.json in the backup is not valid")
def _config(members: dict[str, bytes], manifest: dict[str, Any]) -> None:
    members["config.json"] = json.dumps({"workers": [{"name": "a", "url": "nope"}]}).encode()


@_bad("invalid overrides", "model-placement.json")
def _overrides(members: dict[str, bytes], manifest: dict[str, Any]) -> None:
    members["model-placement.json"] = b'{"version": 7}'


@_bad("not a database", "store/turnout.db")
def _database(members: dict[str, bytes], manifest: dict[str, Any]) -> None:
    members["store/turnout.db"] = b"SQLite format 3\x00" + b"\x00" * 100


def rebuild(
    source: Path, dest: Path, edit: Callable[[dict[str, bytes], dict[str, Any]], None], *, rehash: bool = True
) -> None:
    """Re-pack ``source`` after ``edit``. Changed members the manifest lists get their new size and hash
    (unless ``rehash`` is off), so that each case fails only for the reason it is about."""
    with zipfile.ZipFile(source) as archive:
        members = {n: archive.read(n) for n in archive.namelist() if n != "manifest.json"}
        manifest = json.loads(archive.read("manifest.json"))
    original = dict(members)
    edit(members, manifest)
    for entry in manifest.get("files", []):
        path = entry["path"]
        if rehash and path in original and members.get(path, original[path]) != original[path]:
            entry["size"], entry["sha256"] = len(members[path]), hashlib.sha256(members[path]).hexdigest()
    with zipfile.ZipFile(dest, "w") as out:
        if manifest:
            out.writestr("manifest.json", json.dumps(manifest))
        for name, data in members.items():
            out.writestr(name, data)


@pytest.fixture
def state(tmp_path: Path) -> tuple[Path, Path, Path]:
    config = make_state(tmp_path)
    good = tmp_path / "good.zip"
    create_backup(load_settings(config, env={}), good, now=NOW)
    # then the live state moves on, so that a restore would change things
    settings = load_settings(config, env={})
    settings.placement_file.write_text(json.dumps({"version": 1, "workers": {}}))
    ClaimFiles(settings.data_dir).apply({"metadata": {"name": "later"}, "spec": {"modelName": "org/later"}})
    return config, good, settings.data_dir


@pytest.mark.parametrize(("edit", "message"), [(e, m) for _, e, m in BAD_ZIPS], ids=[n for n, _, _ in BAD_ZIPS])
def test_a_bad_zip_is_refused_and_changes_nothing(
    state: tuple[Path, Path, Path], tmp_path: Path, edit: Any, message: str
) -> None:
    config, good, data_dir = state
    bad = tmp_path / "bad.zip"
    rebuild(good, bad, edit, rehash=edit is not _checksum)
    before = snapshot(config, data_dir)
    with pytest.raises(BackupInvalid, match=message.replace("(", r"\(").replace(")", r"\)")):
        restore_backup(bad, config, env={})
    assert snapshot(config, data_dir) == before


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("garbage", b"this is not a zip at all" * 10, "not a ZIP file"),
        ("empty", b"", "not a ZIP file"),
        ("truncated", None, "not a ZIP file, or a truncated one"),
        ("corrupt", "corrupt", "damaged"),
    ],
)
def test_a_corrupt_or_truncated_file_is_refused(
    state: tuple[Path, Path, Path], tmp_path: Path, name: str, content: Any, message: str
) -> None:
    config, good, data_dir = state
    raw = good.read_bytes()
    bad = tmp_path / f"{name}.zip"
    if content is None:
        bad.write_bytes(raw[: len(raw) // 2])
    elif content == "corrupt":  # flip bytes inside the first member's data (the central directory stays intact)
        with zipfile.ZipFile(good) as archive:
            info = archive.infolist()[0]
        name_len, extra_len = (
            int.from_bytes(raw[info.header_offset + o : info.header_offset + o + 2], "little") for o in (26, 28)
        )
        start = info.header_offset + 30 + name_len + extra_len + 2
        damaged = bytearray(raw)
        damaged[start : start + 8] = bytes(b ^ 0xFF for b in damaged[start : start + 8])
        bad.write_bytes(bytes(damaged))
    else:
        bad.write_bytes(content)
    before = snapshot(config, data_dir)
    with pytest.raises(BackupInvalid, match=message):
        restore_backup(bad, config, env={})
    assert snapshot(config, data_dir) == before


def test_a_symlink_member_is_refused(state: tuple[Path, Path, Path], tmp_path: Path) -> None:
    config, good, data_dir = state
    bad = tmp_path / "link.zip"
    shutil.copy(good, bad)
    with zipfile.ZipFile(bad, "a") as archive:
        info = zipfile.ZipInfo("claims/link.json")
        info.external_attr = 0o120777 << 16
        archive.writestr(info, "/etc/passwd")
    before = snapshot(config, data_dir)
    with pytest.raises(BackupInvalid, match="symbolic link"):
        restore_backup(bad, config, env={})
    assert snapshot(config, data_dir) == before


@pytest.mark.parametrize("where", ["store", "second file"])
def test_a_restore_that_fails_halfway_leaves_the_old_state(
    state: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    config, good, data_dir = state
    settings = load_settings(config, env={})
    if where == "store":

        def broken(staged: Path, live: Path) -> None:
            raise StoreExportError("disk on fire")

        monkeypatch.setattr(restore_module, "sqlite_restore", broken)
    else:
        real = restore_module._Step.commit
        done: list[Path] = []

        def flaky(step: Any) -> None:
            if done:
                raise OSError(28, "No space left on device")
            real(step)
            done.append(step.target)

        monkeypatch.setattr(restore_module._Step, "commit", flaky)
    # a key made after the backup: a restore would remove it
    db = Database(database_url(None, settings.data_dir))
    KeyStore(db).create(app="late", tenant=None, scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=NOW)
    db.close()
    before, keys_before = snapshot(config, data_dir), app_count(config)
    with pytest.raises(BackupError, match="the old state is kept"):
        restore_backup(good, config, env={})
    assert snapshot(config, data_dir) == before and app_count(config) == keys_before == 2
    assert [p for p in data_dir.rglob(".*")] == []


def test_restore_refuses_while_a_gateway_runs_on_the_data_dir(state: tuple[Path, Path, Path]) -> None:
    config, good, data_dir = state
    mark = GatewayMark(data_dir)
    try:
        with pytest.raises(BackupRefused, match="a gateway is running"):
            restore_backup(good, config, env={})
    finally:
        mark.release()
    restore_backup(good, config, env={})  # stopped: fine


def test_the_storage_section_of_the_target_is_kept(state: tuple[Path, Path, Path]) -> None:
    config, good, _ = state
    raw = json.loads(config.read_text())
    raw["workers"] = []
    raw["storage"]["redis_url"] = None
    config.write_text(json.dumps(raw))
    result = restore_backup(good, config, env={})
    restored = json.loads(config.read_text())
    assert restored["storage"] == raw["storage"] and restored["workers"][0]["name"] == "a"
    assert result.config_changed and any("storage section" in w for w in result.warnings)


def test_a_backup_of_another_kind_of_store_is_refused(state: tuple[Path, Path, Path], postgres_database: str) -> None:
    config, good, data_dir = state
    raw = json.loads(config.read_text())
    raw["storage"]["database_url"] = postgres_database
    config.write_text(json.dumps(raw))
    before = snapshot(config, data_dir)
    with pytest.raises(BackupRefused, match="holds a sqlite store but"):
        restore_backup(good, config, env={})
    assert snapshot(config, data_dir) == before


def test_secret_key_warnings(state: tuple[Path, Path, Path], tmp_path: Path) -> None:
    config, good, data_dir = state
    (data_dir / "secret.key").write_bytes(b"Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmE=\n")
    result = restore_backup(good, config, env={})
    assert any("another secret key" in w for w in result.warnings)
    (data_dir / "secret.key").write_bytes(b"cw_0x689RpI-jtRR7oE8h9Tg3bmVD8MhlC3OLBOgBHU=\n")
    assert not restore_backup(good, config, env={}).warnings


async def test_postgres_restore_loads_every_table_and_keeps_sequences(postgres_database: str, tmp_path: Path) -> None:
    config = make_state(tmp_path, database=postgres_database, agents=False)
    settings = load_settings(config, env={})
    out = tmp_path / "pg.zip"
    created = create_backup(settings, out, now=NOW)
    assert created.manifest.store == "postgresql" and "keys" in created.manifest.tables
    assert created.manifest.tables.index("tenants") < created.manifest.tables.index("keys")
    dump = db_dump(postgres_database)
    db = Database(database_url(postgres_database, settings.data_dir))
    KeyStore(db).create(app="late", tenant=None, scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=NOW)
    AuditLog(db).record(actor="t", action="key.create", target="key:late", now=NOW + 5)
    db.close()
    result = restore_backup(out, config, env={})
    assert result.rows is not None and result.rows["keys"] == 1
    after = db_dump(postgres_database)
    assert {k: v for k, v in after.items() if k != "audit"} == {k: v for k, v in dump.items() if k != "audit"}
    assert len(after["audit"]) == len(dump["audit"]) + 1 and "key:late" in after["audit"][-1]  # append-only
    db = Database(database_url(postgres_database, settings.data_dir))
    try:  # the id sequences continue after the restored rows
        record, _ = KeyStore(db).create(
            app="next", tenant=None, scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=NOW
        )
        assert record.id == 2
    finally:
        db.close()


async def test_postgres_restore_that_fails_rolls_back(postgres_database: str, tmp_path: Path) -> None:
    config = make_state(tmp_path, database=postgres_database, agents=False)
    out, bad = tmp_path / "pg.zip", tmp_path / "bad.zip"
    create_backup(load_settings(config, env={}), out, now=NOW)

    def duplicate(members: dict[str, bytes], manifest: dict[str, Any]) -> None:
        members["store/keys.jsonl"] += members["store/keys.jsonl"]  # the database refuses the second copy

    def unknown_column(members: dict[str, bytes], manifest: dict[str, Any]) -> None:
        members["store/keys.jsonl"] += b'{"id": 9, "nonsense": true}\n'

    dump = db_dump(postgres_database)
    for edit, message in ((duplicate, "UniqueViolation|IntegrityError"), (unknown_column, "not in table keys")):
        rebuild(out, bad, edit)
        with pytest.raises(BackupError, match=f"the old state is kept: .*({message})"):
            restore_backup(bad, config, env={})
        assert db_dump(postgres_database) == dump


def test_open_backup_reads_a_good_zip(state: tuple[Path, Path, Path]) -> None:
    _, good, _ = state
    with open_backup(good) as (_, manifest):
        assert manifest.claims == ["big", "small"] and manifest.store == "sqlite"
    assert os.path.exists(good)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_backup_from_an_older_schema_is_migrated_as_it_is_restored(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from sqlalchemy import text

    from turnout.state.store_export import _upgrade, head_revision

    url = (
        f"sqlite:///{tmp_path / 'data' / 'turnout.db'}"
        if kind == "sqlite"
        else request.getfixturevalue("postgres_database")
    )
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"storage": {"data_dir": "data", "database_url": url}}))
    (tmp_path / "data").mkdir()
    db = Database(database_url(url, tmp_path / "data"))
    with db.engine.begin() as conn:  # a store as Turnout's migration 0003 left it
        _upgrade(conn, "0003")
        conn.execute(text("INSERT INTO tenants (id, name, weight, created_at) VALUES (1, 'default', 1, 0)"))
        conn.execute(text("INSERT INTO apps (id, tenant_id, name, created_at) VALUES (1, 1, 'web', 0)"))
        conn.execute(
            text(
                "INSERT INTO keys (id, app_id, prefix, hash, models, created_at) "
                "VALUES (1, 1, 'tk_old', :hash, '[\"*\"]', 0)"
            ),
            {"hash": "0" * 64},
        )
    db.close()
    out = tmp_path / "old.zip"
    assert create_backup(load_settings(config, env={}), out, now=NOW).manifest.schema_revision == "0003"
    restore_backup(out, config, env={})
    db = Database(database_url(url, tmp_path / "data"))
    try:
        with db.engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == head_revision()
        assert [k.prefix for k in KeyStore(db).all()] == ["tk_old"]
    finally:
        db.close()


def test_a_restored_file_keeps_the_mode_of_the_file_it_replaces(state: tuple[Path, Path, Path], tmp_path: Path) -> None:
    config, good, data_dir = state
    placement = data_dir / "model-placement.json"
    placement.chmod(0o600)
    restore_backup(good, config, env={})
    assert oct(placement.stat().st_mode & 0o777) == "0o600"
    assert json.loads(placement.read_text())["workers"]["a"]["mode"] == "whitelist"
    fresh = tmp_path / "elsewhere" / "config.json"  # a new machine: the config is written private
    raw = json.loads(config.read_text())
    fresh.parent.mkdir()
    with pytest.raises(BackupRefused, match="a gateway is running"):
        mark = GatewayMark((fresh.parent / raw["storage"]["data_dir"]).resolve())
        try:
            restore_backup(good, fresh, env={})
        finally:
            mark.release()
    restore_backup(good, fresh, env={})
    assert oct(fresh.stat().st_mode & 0o777) == "0o600"


def test_a_claim_a_backup_could_not_restore_is_refused_when_the_backup_is_made(tmp_path: Path) -> None:
    config = make_state(tmp_path)
    settings = load_settings(config, env={})
    ClaimFiles(settings.data_dir).apply({"metadata": {"name": "with space"}, "spec": {"modelName": "org/x"}})
    with pytest.raises(BackupError, match="a claim file name a backup cannot hold"):
        create_backup(settings, tmp_path / "b.zip", now=NOW)
    assert not (tmp_path / "b.zip").exists() and list(tmp_path.glob(".b.zip*")) == []


def test_the_gateway_mark_is_seen_by_another_open_and_released(tmp_path: Path) -> None:
    from turnout.state.running import gateway_running

    assert not gateway_running(tmp_path)
    first, second = GatewayMark(tmp_path), GatewayMark(tmp_path)  # replicas share it
    assert gateway_running(tmp_path)
    first.release()
    assert gateway_running(tmp_path)
    second.release()
    assert not gateway_running(tmp_path)
    (tmp_path / "file").write_text("")
    GatewayMark(tmp_path / "file" / "data").release()  # cannot be held (not a directory): logged, not raised
