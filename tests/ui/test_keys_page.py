"""The Keys page in a real browser: create a key and see it once, use it (last used), edit scopes and limits
(a bad field shown next to it, a stale edit refused), rotate with grace, revoke, filter."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.conftest import ADMIN_TOKEN, worker
from tests.ui.conftest import sign_in
from turnout.gateway.keys import AUDIT

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def chat(gw, key: str, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http, http.post(f"{gw.url}/api/chat", json=body, headers=headers) as r:
        await r.read()
        return r.status


async def test_create_see_once_edit_rotate_revoke(page, gateway, emulator) -> None:
    emu = await emulator("w1", ["qwen3:8b", "llama3.2:latest"])
    gw = await gateway([worker("w1", emu.url)], auth={"open": False})
    await sign_in(page, gw)
    await page.click("nav >> text=Keys")
    await page.wait_for_url(f"{gw.url}/admin/keys")
    assert await page.locator("#no-keys").is_visible()

    await page.fill("#k-app", "chat-ui")
    await page.fill("#k-tenant", "research")
    await page.fill("#k-models", "qwen3:*")
    await page.fill("#k-rpm", "60")
    await page.click("#k-create")
    await page.locator("#secret-reveal").wait_for()
    key = await page.input_value("#secret-value")
    assert key.startswith("tk_")
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=gw.url)
    await page.click("#secret-copy")
    await page.locator("#toast").filter(has_text="Copied").wait_for()
    assert await page.evaluate("navigator.clipboard.readText()") == key
    row = page.locator(f"tr[data-key={key[:10]}]")
    await row.wait_for()
    assert await row.get_attribute("data-state") == "active"
    assert "never" in await row.locator("[data-last-used]").inner_text()
    assert await chat(gw, key, "qwen3:8b") == 200
    assert await chat(gw, key, "llama3.2") == 403  # outside its scope

    response = await page.reload()
    assert response.headers["cache-control"] == "no-store"
    assert key not in await page.content()  # shown once: gone after a reload
    # usage is written off the request path, at most a second late: reload until it shows (bounded)
    for _ in range(20):
        if "never" not in await row.locator("[data-last-used]").inner_text():
            break
        await asyncio.sleep(0.25)
        await page.reload()
    assert "never" not in await row.locator("[data-last-used]").inner_text()

    await row.get_by_role("button", name=f"Edit key {key[:10]}").click()
    await page.fill("#e-rpm", "0")
    await page.click("#edit-save")
    await page.locator("#e-rpm-error").filter(has_text="at least 1").wait_for()
    assert await page.get_attribute("#e-rpm", "aria-invalid") == "true"
    await page.fill("#e-rpm", "120")
    await page.fill("#e-models", "qwen3:*\nllama3.2")
    await page.click("#edit-save")
    await row.locator("[data-limits]").filter(has_text="120 requests").wait_for()
    assert "llama3.2" in await row.locator("[data-scopes]").inner_text()
    assert await chat(gw, key, "llama3.2") == 200  # the new scope applies at once

    await row.get_by_role("button", name=f"Rotate key {key[:10]}").click()
    await page.fill("#r-grace", "1")
    await page.click("#rotate-confirm")
    await page.locator("#secret-note").filter(has_text="works until").wait_for()
    new_key = await page.input_value("#secret-value")
    assert new_key.startswith("tk_") and new_key != key
    await row.locator("text=in grace").wait_for()
    assert "works until" in await row.locator("[data-state-text]").inner_text()
    assert await chat(gw, key, "qwen3:8b") == 200 and await chat(gw, new_key, "qwen3:8b") == 200

    new_row = page.locator(f"tr[data-key={new_key[:10]}]")
    await new_row.get_by_role("button", name=f"Revoke key {new_key[:10]}").click()
    await page.click("#revoke-confirm")
    await page.locator(f"tr[data-key={new_key[:10]}][data-state=revoked]").wait_for()
    assert await chat(gw, new_key, "qwen3:8b") == 401

    actions = [e.action for e in gw.app[AUDIT].entries(limit=50)]
    for action in ("key.create", "key.change", "key.rotate", "key.revoke"):
        assert action in actions, action


async def test_filters_and_a_stale_edit(page, gateway) -> None:
    gw = await gateway([])
    async with aiohttp.ClientSession(headers=ADMIN) as http:
        for body in ({"app": "a1", "tenant": "t1"}, {"app": "b1", "tenant": "t2", "models": ["mac/*"]}):
            async with http.post(f"{gw.url}/admin/api/keys", json=body) as r:
                assert r.status == 201
        await sign_in(page, gw)
        await page.goto(f"{gw.url}/admin/keys")
        assert await page.locator("#keys-table tbody tr").count() == 2
        await page.select_option("#f-tenant", "t2")
        await page.click("#keys-filters button[type=submit]")
        await page.wait_for_url(f"{gw.url}/admin/keys?tenant=t2&app=&endpoint=&state=")
        assert await page.locator("#keys-table tbody tr").count() == 1
        assert "b1" in await page.inner_text("#keys-table tbody tr")
        await page.goto(f"{gw.url}/admin/keys?tenant=t1&state=revoked")
        assert await page.locator("#no-keys").filter(has_text="No key matches").count() == 1

        await page.goto(f"{gw.url}/admin/keys?app=a1")
        row = page.locator("#keys-table tbody tr")
        prefix = await row.get_attribute("data-key")
        await row.get_by_role("button", name=f"Edit key {prefix}").click()
        async with http.patch(f"{gw.url}/admin/api/keys/{prefix}", json={"rpm": 5}) as r:
            assert r.status == 200  # changed by someone else meanwhile
        await page.fill("#e-rpm", "50")
        await page.click("#edit-save")
        await page.locator("#edit-form [data-error-for='']").filter(has_text="changed elsewhere").wait_for()
        async with http.get(f"{gw.url}/admin/api/keys/{prefix}") as r:
            assert (await r.json())["rpm"] == 5
