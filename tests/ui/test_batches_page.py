"""The Batches page in a real browser: batches of the OpenAI Batch API made through a real gateway (its worker the
Ollama emulator, slowed so a batch runs long enough to watch), their state and progress refreshing by themselves,
a cancel from the page, the filters, and the German catalog."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.conftest import ADMIN_TOKEN, Gateway, create_key, worker
from tests.ui.conftest import sign_in


async def make_batch(gw: Gateway, key: str, lines: int) -> str:
    rows = [
        {
            "custom_id": f"l{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m:latest", "messages": [{"role": "user", "content": "hi"}]},
        }
        for n in range(lines)
    ]
    data = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", data, filename="lines.jsonl")
        async with http.post(f"{gw.url}/v1/files", data=form) as r:
            assert r.status == 200, await r.text()
            file_id = (await r.json())["id"]
        body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        async with http.post(f"{gw.url}/v1/batches", json=body) as r:
            assert r.status == 200, await r.text()
            batch_id: str = (await r.json())["id"]
            return batch_id


async def test_batches_with_progress_and_a_cancel(page: Any, gateway: Any, emulator: Any) -> None:
    emu = await emulator("slow", ["m:latest"], token_delay_s=0.04)
    gw = await gateway([worker("slow", emu.url)], auth={"open": False}, batches={"poll_s": 0.2, "lines_in_flight": 1})
    _, key = create_key(gw, app="evals", tenant="research")
    quick = await make_batch(gw, key, 2)
    slow = await make_batch(gw, key, 200)
    await sign_in(page, gw)
    await page.click("nav >> text=Batches")
    await page.wait_for_url(f"{gw.url}/admin/batches")
    row = page.locator(f"tr[data-batch={quick}]")
    assert "app evals · tenant research" in await row.inner_text()
    assert await row.locator("[data-model]").inner_text() == "m:latest"  # the model its lines name
    await page.locator(f"tr[data-batch={quick}][data-status=completed]").wait_for(timeout=30_000)  # refreshed itself
    assert "2 of 2 lines (100 %)" in await page.locator(f"tr[data-batch={quick}] [data-progress]").inner_text()
    running = page.locator(f"tr[data-batch={slow}][data-status=in_progress]")
    await running.wait_for(timeout=30_000)
    assert await page.locator(f"tr[data-batch={slow}] progress").get_attribute("max") == "200"
    page.once("dialog", lambda dialog: dialog.accept())
    await page.click(f"tr[data-batch={slow}] button[data-action=cancel]")
    await page.locator(f"tr[data-batch={slow}][data-status=cancelled]").wait_for(timeout=30_000)
    progress = await page.locator(f"tr[data-batch={slow}] [data-progress]").inner_text()
    assert "(100 %)" not in progress and "never answered" in progress  # the lines cancelled are not "answered"
    assert await page.locator(f"tr[data-batch={quick}] button[data-action=cancel]").count() == 0
    # the filters: a state, then back to all
    await page.select_option("#f-status", "cancelled")
    await page.click("#batches-filters button[type=submit]")
    await page.wait_for_url(f"{gw.url}/admin/batches?app=&status=cancelled")
    assert await page.locator("#batches-table tbody tr").count() == 1
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http,
        http.get(f"{gw.url}/admin/api/audit?action=batch.cancel") as r,
    ):
        entries = (await r.json())["entries"]
    assert [e["target"] for e in entries] == [f"batch:{slow}"]


async def test_batches_in_german(page: Any, gateway: Any, emulator: Any) -> None:
    emu = await emulator("w", ["m:latest"])
    gw = await gateway([worker("w", emu.url)], auth={"open": False}, batches={"poll_s": 0.2})
    _, key = create_key(gw, app="evals")
    batch = await make_batch(gw, key, 3)
    await sign_in(page, gw, lang="de")
    await page.click("nav >> text=Batches")
    await page.locator(f"tr[data-batch={batch}][data-status=completed]").wait_for(timeout=30_000)
    text = await page.locator(f"tr[data-batch={batch}]").inner_text()
    assert "abgeschlossen" in text and "3 von 3 Zeilen (100 %)" in text and "Mandant" in text
    assert await page.locator("#batches-table th[scope=col]").first.inner_text() == "Batch"


async def test_no_batches(page: Any, gateway: Any) -> None:
    gw = await gateway([])
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/batches")
    assert "No batches yet" in await page.inner_text("#no-batches")
