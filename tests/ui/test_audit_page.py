"""The Audit page in a real browser: every change made in the UI is an entry; filters by action, actor and time;
before and after side by side with the changed fields named; a bad filter shown next to its field."""

from __future__ import annotations

import time

from tests.ui.conftest import sign_in
from turnout.gateway.keys import AUDIT


async def test_entries_filters_and_before_after(page, gateway) -> None:
    gw = await gateway([])
    gw.app[AUDIT].record(actor="cli:alice", action="key.revoke", target="key:other", now=time.time() - 7200)
    await sign_in(page, gw)
    # changes made through the Keys page, each audited
    await page.goto(f"{gw.url}/admin/keys")
    await page.fill("#k-app", "chat-ui")
    await page.fill("#k-rpm", "60")
    await page.click("#k-create")
    await page.locator("#secret-reveal").wait_for()
    row = page.locator("#keys-table tbody tr")
    await row.wait_for()
    prefix = await row.get_attribute("data-key")
    await row.get_by_role("button", name=f"Edit key {prefix}").click()
    await page.fill("#e-rpm", "120")
    await page.click("#edit-save")
    await row.locator("[data-limits]").filter(has_text="120").wait_for()

    await page.click("nav >> text=Audit")
    await page.wait_for_url(f"{gw.url}/admin/audit")
    actions = [await r.get_attribute("data-action") for r in await page.locator("#audit-table > tbody > tr").all()]
    assert actions == ["key.change", "key.create", "admin.signin", "key.revoke"]

    await page.select_option("#a-action", "key.change")
    await page.click("#audit-filters button[type=submit]")
    entry = page.locator("#audit-table > tbody > tr")
    await page.wait_for_function("document.querySelectorAll('#audit-table > tbody > tr').length === 1")
    assert f"key:{prefix}" in await entry.inner_text()
    changed = entry.locator("table.changes tbody tr")
    assert await changed.evaluate_all("rs => rs.map(r => r.dataset.field)") == ["rpm"]  # only what changed
    assert await changed.locator("[data-before]").inner_text() == "60"
    assert await changed.locator("[data-after]").inner_text() == "120"
    await entry.locator("summary").click()  # everything, side by side
    assert '"rpm": 60' in await entry.locator("pre[data-before]").inner_text()
    assert '"rpm": 120' in await entry.locator("pre[data-after]").inner_text()

    await page.goto(f"{gw.url}/admin/audit")
    await page.select_option("#a-actor", "cli:alice")
    await page.click("#audit-filters button[type=submit]")
    await page.wait_for_function("document.querySelectorAll('#audit-table > tbody > tr').length === 1")
    assert await page.locator("#audit-table > tbody > tr").get_attribute("data-action") == "key.revoke"

    await page.goto(f"{gw.url}/admin/audit")
    await page.fill("#a-since", "1h")
    await page.click("#audit-filters button[type=submit]")
    await page.wait_for_url("**since=1h**")
    assert "key.revoke" not in [
        await r.get_attribute("data-action") for r in await page.locator("#audit-table > tbody > tr").all()
    ]

    await page.fill("#a-since", "yesterday-ish")
    await page.click("#audit-filters button[type=submit]")
    await page.locator("#a-since-error").filter(has_text="cannot read time").wait_for()
    assert await page.get_attribute("#a-since", "aria-invalid") == "true"
