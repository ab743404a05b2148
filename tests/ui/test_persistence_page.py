"""The Persistence page in a real browser: the state files listed, a backup downloaded (the secret key only
when asked) and restored through the page."""

from __future__ import annotations

import zipfile
from pathlib import Path

import aiohttp

from tests.conftest import ADMIN_TOKEN
from tests.ui.conftest import sign_in
from turnout.gateway.keys import AUDIT, KEYS

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def test_download_a_backup_and_restore_it(page, gateway, tmp_path: Path) -> None:
    gw = await gateway([])
    gw.app[KEYS].create(app="kept", tenant=None, scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=1.0)
    await sign_in(page, gw)
    await page.click("nav >> text=Persistence")
    await page.wait_for_url(f"{gw.url}/admin/persistence")
    rows = page.locator("#state-table tbody tr")
    ids = [await r.get_attribute("data-state-id") for r in await rows.all()]
    assert {"config", "model_placement", "database", "secret_key", "admin_token"} <= set(ids)
    database = page.locator("tr[data-state-id=database]")
    assert await database.get_attribute("data-backup") == "included"
    assert str(gw.data_dir) in await database.inner_text()
    assert await page.locator("tr[data-state-id=secret_key]").get_attribute("data-backup") == "optional"
    assert "only when this box is ticked" in await page.inner_text("#secret-key-note")

    async with page.expect_download() as info:
        await page.click("#backup-download")
    saved = tmp_path / "backup.zip"
    await (await info.value).save_as(saved)
    with zipfile.ZipFile(saved) as archive:
        names = archive.namelist()
    assert "manifest.json" in names and not any("secret" in n for n in names)  # not asked for

    # a change after the backup, which the restore takes back
    gw.app[KEYS].create(app="later", tenant=None, scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=2.0)
    await page.click("#restore-start")
    await page.locator("#restore-error").filter(has_text="Choose a backup").wait_for()
    await page.set_input_files("#restore-file", saved)
    await page.click("#restore-start")
    await page.locator("#restore-dialog").wait_for()
    await page.click("#restore-confirm")
    await page.locator("#restore-summary.ok").wait_for(timeout=30_000)
    assert [k.app for k in gw.app[KEYS].all()] == ["kept"]
    actions = [e.action for e in gw.app[AUDIT].entries(limit=50)]
    assert "backup.restore" in actions


async def test_a_bad_zip_is_refused_and_nothing_changes(page, gateway, tmp_path: Path) -> None:
    gw = await gateway([])
    gw.app[KEYS].create(app="kept", tenant=None, scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=1.0)
    bogus = tmp_path / "not-a-backup.zip"
    with zipfile.ZipFile(bogus, "w") as archive:
        archive.writestr("hello.txt", "not a backup")
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/persistence")
    await page.set_input_files("#restore-file", bogus)
    await page.click("#restore-start")
    await page.click("#restore-confirm")
    await page.locator("#restore-summary.error").filter(has_text="Not restored").wait_for()
    assert [k.app for k in gw.app[KEYS].all()] == ["kept"]


async def test_secret_key_only_when_asked(page, gateway, tmp_path: Path) -> None:
    gw = await gateway([])
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/persistence")
    await page.check("#include-secret-key")
    async with page.expect_download() as info:
        await page.click("#backup-download")
    saved = tmp_path / "with-key.zip"
    await (await info.value).save_as(saved)
    with zipfile.ZipFile(saved) as archive:
        assert any("secret" in n for n in archive.namelist())
    async with aiohttp.ClientSession(headers=ADMIN) as http, http.get(f"{gw.url}/admin/api/audit") as r:
        created = [e for e in (await r.json())["entries"] if e["action"] == "backup.create"]
    assert created and created[0]["after"]["secret_key_included"] is True
