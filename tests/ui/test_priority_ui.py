"""Priority classes in the admin UI, in a real browser: the Keys page shows each key's class (its own, or its
tenant's default, said so), creates and edits it (English and German); the Overview shows the requests waiting
and running by class while a held engine keeps them."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.conftest import create_key, eventually, serve_app, worker
from tests.support.engine_emulator import VLLM, Engine, build_app
from tests.ui.conftest import sign_in
from turnout.core.admission import Priority
from turnout.gateway.keys import DISPATCHER


async def test_the_keys_page_shows_creates_and_edits_a_keys_class(page, gateway, emulator) -> None:
    emu = await emulator("w1", ["m:1"])
    gw = await gateway([worker("w1", emu.url)], auth={"open": False}, tenants={"research": {"priority": "batch"}})
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/keys")

    await page.fill("#k-app", "agent")
    await page.select_option("#k-priority", "interactive")
    await page.click("#k-create")
    await page.locator("#secret-reveal").wait_for()
    agent = (await page.input_value("#secret-value"))[:10]
    await page.fill("#k-app", "nightly")
    await page.fill("#k-tenant", "research")
    await page.click("#k-create")
    await page.locator("#secret-note").filter(has_text="nightly").wait_for()
    nightly = (await page.input_value("#secret-value"))[:10]

    agent_cell = page.locator(f"tr[data-key={agent}] td[data-priority]")
    nightly_cell = page.locator(f"tr[data-key={nightly}] td[data-priority]")
    await agent_cell.wait_for()
    await nightly_cell.wait_for()
    assert await agent_cell.get_attribute("data-priority") == "interactive"
    assert (await agent_cell.inner_text()).split() == ["interactive"]
    assert await nightly_cell.get_attribute("data-priority") == "batch"  # config.json's default for research
    assert "tenant's default" in await nightly_cell.inner_text()
    assert "Priority" in await page.inner_text("#keys-table thead")

    row = page.locator(f"tr[data-key={agent}]")
    await row.get_by_role("button", name=f"Edit key {agent}").click()
    assert await page.input_value("#e-priority") == "interactive"  # the dialog starts from the key's own
    await page.select_option("#e-priority", "")  # the tenant's default
    await page.click("#edit-save")
    await page.locator(f"tr[data-key={agent}] td[data-priority=standard]").wait_for()
    assert "tenant's default" in await agent_cell.inner_text()
    await row.get_by_role("button", name=f"Edit key {agent}").click()
    assert await page.input_value("#e-priority") == ""
    await page.select_option("#e-priority", "batch")
    await page.click("#edit-save")
    await page.locator(f"tr[data-key={agent}] td[data-priority=batch]").wait_for()

    await page.click("header form.lang button[value=de]")
    await page.wait_for_function("document.documentElement.lang === 'de'")
    await page.goto(f"{gw.url}/admin/keys")
    assert "Priorität" in await page.inner_text("#keys-table thead")
    assert "Vorgabe des Mandanten" in await nightly_cell.inner_text()
    options = await page.locator("#k-priority option").all_inner_texts()
    assert options == ["Vorgabe des Mandanten", "interaktiv", "Standard", "Batch"]


async def test_the_overview_shows_requests_waiting_and_running_by_class(page, gateway) -> None:
    engine = Engine(VLLM, "m", False, True, hold=True)
    url, runner = await serve_app(build_app(engine, dev_mode=False))
    gw = await gateway([worker("v", url, type="openai", max_concurrent=1)], auth={"open": False})
    _, batch_key = create_key(gw, app="nightly", priority=Priority.BATCH)
    _, agent_key = create_key(gw, app="agent", priority=Priority.INTERACTIVE)
    tasks: list[asyncio.Task[int]] = []
    async with aiohttp.ClientSession() as http:

        async def chat(key: str) -> int:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            headers = {"Authorization": f"Bearer {key}"}
            async with http.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers) as resp:
                await resp.read()
                return resp.status

        try:
            tasks.append(asyncio.create_task(chat(batch_key)))
            await eventually(lambda: _true(len(engine.running) == 1), "the batch request running")
            tasks.append(asyncio.create_task(chat(agent_key)))
            await eventually(lambda: _true(gw.app[DISPATCHER].waiting == 1), "the interactive request waiting")
            await sign_in(page, gw)
            table = page.locator("#classes")
            counts = {}
            for name in ("interactive", "standard", "batch"):
                cells = table.locator(f"tr[data-class={name}]")
                counts[name] = (
                    await cells.locator("td[data-waiting]").inner_text(),
                    await cells.locator("td[data-running]").inner_text(),
                )
            assert counts == {"interactive": ("1", "0"), "standard": ("0", "0"), "batch": ("0", "1")}
            assert "Requests by priority class" in await page.inner_text("#overview-body")
        finally:
            engine.hold = False
            for request in [*engine.running, *engine.waiting]:
                request.ended.set()
            assert await asyncio.gather(*tasks) == [200] * len(tasks)
            await runner.cleanup()


async def _true(value: bool) -> bool:
    return value
