"""Every page: German labels, labelled controls, keyboard use, and the Overview refreshing itself."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.conftest import free_port, worker
from tests.ui.conftest import sign_in
from turnout.admin.ui.render import NAV
from turnout.gateway.keys import FLEET, POLLER

# Every form control has an accessible name; every button and link has text (or aria-label).
UNLABELLED = """() => {
  const name = el => (el.getAttribute('aria-label') || '').trim()
    || (el.getAttribute('aria-labelledby') || '').split(/\\s+/).filter(Boolean)
         .map(id => (document.getElementById(id) || {}).textContent || '').join(' ').trim()
    || (el.labels ? [...el.labels].map(l => l.textContent).join(' ').trim() : '');
  const bad = [];
  for (const el of document.querySelectorAll('input, select, textarea')) {
    if (el.type === 'hidden') continue;
    if (!name(el)) bad.push(el.outerHTML.slice(0, 120));
  }
  for (const el of document.querySelectorAll('button, a[href]')) {
    if (!(el.textContent.trim() || el.getAttribute('aria-label') || el.title)) bad.push(el.outerHTML.slice(0, 120));
  }
  return bad;
}"""


async def ui_pages(page: Any, gw: Any) -> list[str]:
    """The nav's pages that exist in this build, plus the ruleset editor."""
    hrefs = await page.eval_on_selector_all("header nav a", "links => links.map(a => a.getAttribute('href'))")
    return [*hrefs, "/admin/placement/workers/w1"]


async def test_every_page_labels_its_controls(page, gateway, emulator) -> None:
    emu = await emulator("w1", models=["llama3.2:latest"])
    gw = await gateway([worker("w1", emu.url)])
    await page.goto(f"{gw.url}/admin")
    assert await page.evaluate(UNLABELLED) == []
    await sign_in(page, gw)
    paths = await ui_pages(page, gw)
    assert {"/admin/overview", "/admin/placement"} <= set(paths)
    for path in paths:
        await page.goto(gw.url + path)
        assert await page.evaluate(UNLABELLED) == [], path
        assert await page.locator("h1").count() == 1, path
    response = await page.goto(f"{gw.url}/admin/no-such-page")
    assert response.status == 404 and response.headers["x-frame-options"] == "DENY"
    assert await page.inner_text("h1") == "Something went wrong"  # a page, not a JSON error


async def test_german_labels_are_remembered(page, gateway, emulator) -> None:
    emu = await emulator("w1", models=["llama3.2:latest"])
    gw = await gateway([worker("w1", emu.url)])
    await sign_in(page, gw, lang="de")
    assert await page.get_attribute("html", "lang") == "de"
    nav = await page.inner_text("header nav")
    assert "Übersicht" in nav and "Modellplatzierung" in nav
    if "ui.persistence" in gw.app.router.named_resources():
        assert "Persistenz" in nav
    assert await page.inner_text("h1") == "Übersicht"
    await page.goto(f"{gw.url}/admin/placement")
    assert "gesperrt" in await page.inner_text(".legend")
    await page.locator("#matrix td").first.hover()
    assert "auf w1: erlaubt, installiert. Entschieden durch" in await page.inner_text("#cell-info")
    await page.goto(f"{gw.url}/admin/placement/workers/w1")
    assert await page.inner_text("#only-installed") == "Nur installierte"
    assert await page.inner_text("#reset") == "Auf Konfigurationsvorgabe zurücksetzen"
    # back to English from any page; the choice is a cookie, so it survives sign-out
    await page.click("header form.lang button[value=en]")
    await page.wait_for_function("document.documentElement.lang === 'en'")
    assert page.url == f"{gw.url}/admin/placement/workers/w1"
    assert await page.inner_text("#only-installed") == "Only installed"


async def test_keyboard_only(page, gateway, emulator) -> None:
    emu = await emulator("w1", models=["llama3.2:latest"])
    gw = await gateway([worker("w1", emu.url)])
    await page.goto(f"{gw.url}/admin")
    assert await page.evaluate("document.activeElement.id") == "token"  # the form starts focused
    await page.keyboard.type("test-admin-token")
    await page.keyboard.press("Enter")
    await page.wait_for_url(f"{gw.url}/admin/overview")
    await page.keyboard.press("Tab")
    assert await page.evaluate("document.activeElement.className") == "skip"
    await page.keyboard.press("Enter")
    assert await page.evaluate("document.activeElement.id") == "main"
    # the nav is reachable by Tab, in order, and Enter follows a link
    await page.evaluate("document.activeElement.blur()")
    await page.keyboard.press("Tab")  # skip link
    await page.keyboard.press("Tab")  # brand
    for _ in range(len(NAV) + 2):
        await page.keyboard.press("Tab")
        if await page.evaluate("document.activeElement.textContent") == "Model Placement":
            break
    await page.keyboard.press("Enter")
    await page.wait_for_url(f"{gw.url}/admin/placement")
    # the editor works from the keyboard: Space on a radio, Tab to Save, Enter
    await page.goto(f"{gw.url}/admin/placement/workers/w1")
    await page.focus("input[name=mode][value=allow_all]")
    await page.keyboard.press("ArrowDown")  # radios move with the arrow keys
    assert await page.is_checked("input[name=mode][value=whitelist]")
    await page.focus("#allowed_models")
    await page.keyboard.type("llama3.2")
    await page.focus("#save")
    await page.keyboard.press("Enter")
    await page.wait_for_function("() => document.getElementById('rules-source').textContent.includes('UI')")
    assert gw.app[FLEET].rules("w1")[0].to_json()["allowed_models"] == ["llama3.2"]


async def test_overview_refreshes_itself(page, gateway, emulator) -> None:
    w1 = await emulator("w1", models=["llama3.2:latest"])
    gw = await gateway([worker("w1", w1.url), worker("gone", f"http://127.0.0.1:{free_port()}")])
    await sign_in(page, gw)
    row = page.locator("#workers tr[data-worker=w1]")
    assert "up" in await row.inner_text()
    gone = await page.inner_text("#workers tr[data-worker=gone]")
    assert "down" in gone and "cannot connect" in gone  # why it is down
    await page.evaluate("window.__same_page = true")
    await w1.stop()
    await gw.app[POLLER].poll_all()
    await page.wait_for_function(
        "() => document.querySelector('#workers tr[data-worker=w1]').textContent.includes('down')", timeout=15_000
    )
    assert await page.evaluate("window.__same_page") is True  # updated in place, not reloaded
    assert await page.inner_text('[data-stat="workers"]') == "0 / 2"


async def test_overview_worker_rows_open_their_ruleset(page, gateway, emulator) -> None:
    """As the design's worker cards do: a click anywhere on a worker's row, or its name's link (keyboard, screen
    readers), opens that worker's ruleset editor; also after the body refreshed itself."""
    w1 = await emulator("w1", models=["llama3.2:latest"])
    w2 = await emulator("w.2", models=["qwen3:8b"])
    gw = await gateway([worker("w1", w1.url), worker("w.2", w2.url)])
    await sign_in(page, gw)
    link = page.locator('#workers tr[data-worker="w.2"] th a')
    assert await link.get_attribute("title") == "Open the ruleset of w.2"
    await page.locator('#workers tr[data-worker="w.2"] td').last.click()  # not on the link: the row itself
    await page.wait_for_url(f"{gw.url}/admin/placement/workers/w.2")
    assert await page.inner_text("h1") == "Ruleset of w.2"
    await page.go_back()
    await page.wait_for_url(f"{gw.url}/admin/overview")
    # the rows as the body's own refresh re-renders them
    await page.evaluate("document.getElementById('overview-body').dataset.old = 'yes'")
    await page.evaluate("htmx.ajax('GET', '/admin/overview/fragment', {target: '#overview-body', swap: 'outerHTML'})")
    await page.wait_for_function("() => !document.getElementById('overview-body').dataset.old")
    await page.focus("#workers tr[data-worker=w1] th a")
    await page.keyboard.press("Enter")
    await page.wait_for_url(f"{gw.url}/admin/placement/workers/w1")
    assert await page.inner_text("h1") == "Ruleset of w1"


async def test_overview_lists_endpoints_with_state_and_since(page, gateway, emulator) -> None:
    gpu = await emulator("gpu", models=["qwen3:8b"])
    mac = await emulator("mac", models=["llama3.2:latest"])
    gw = await gateway([worker("gpu", gpu.url)], env={"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true"})
    async with aiohttp.ClientSession(headers=gw.admin_headers) as http:
        endpoint = {"name": "mac", "url": mac.url, "api": "ollama"}
        async with http.post(f"{gw.url}/admin/api/endpoints", json=endpoint) as r:
            assert r.status == 201, await r.text()
    await sign_in(page, gw)
    row = await page.inner_text("#endpoints tr[data-endpoint=mac]")
    assert "online" in row and "since 20" in row and "UTC" in row
    assert await page.locator("#workers tr[data-worker=mac]").count() == 0  # an endpoint is not listed as a worker
    assert await page.inner_text('[data-stat="endpoints"]') == "1 / 1"


async def test_the_placement_editor_takes_a_gateway_gone_quietly(page, gateway, emulator) -> None:
    """The rules are checked as you type (250 ms after the last key); a gateway that does not answer then (it
    restarts, or the page closes) leaves the field as it was, never a script error (the page fixture fails on one:
    a clean-clone CI run caught this 'Failed to fetch' after a test had ended)."""
    import asyncio

    emu = await emulator("w1", models=["llama3.2:latest"])
    gw = await gateway([worker("w1", emu.url)])
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/placement/workers/w1")
    await page.focus("#allowed_models")
    await page.keyboard.type("llama3.2")
    await gw.stop()  # before the check is sent
    await asyncio.sleep(0.6)
    assert await page.input_value("#allowed_models") == "llama3.2"
