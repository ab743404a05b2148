"""The Overview says whether the replicas' shared routing state (Redis) answers: how many replicas share it, or
that this replica routes on its own counts while Redis is away (issue 33: shown in /healthz, a metric and here)."""

from __future__ import annotations

import aiohttp

from tests.conftest import worker
from tests.support.services import redis_server
from tests.ui.conftest import sign_in


async def test_the_overview_shows_the_shared_state_and_when_redis_is_away(page, gateway, emulator, tmp_path) -> None:
    emu = await emulator("a", models=["m:1"])
    with redis_server() as url:
        storage = {"data_dir": str(tmp_path / "data"), "redis_url": url}
        gw = await gateway([worker("a", emu.url)], storage=storage)
        await sign_in(page, gw)
        card = page.locator("[data-stat=shared-state]")
        assert await card.get_attribute("data-up") == "yes"
        assert "1" in await card.inner_text() and "Redis" in await card.inner_text()
    async with aiohttp.ClientSession() as http:  # Redis gone: the next request finds out, and is served anyway
        body = {"model": "m:1", "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(f"{gw.url}/v1/chat/completions", json=body) as r:
            assert r.status == 200
        async with http.get(f"{gw.url}/healthz") as r:
            assert (await r.json())["shared_state"] == "local"
    await page.reload()
    card = page.locator("[data-stat=shared-state]")
    assert await card.get_attribute("data-up") == "no"
    assert "Redis away" in await card.inner_text()


async def test_without_redis_the_overview_says_nothing_of_shared_state(page, gateway, emulator) -> None:
    emu = await emulator("a", models=["m:1"])
    gw = await gateway([worker("a", emu.url)])
    await sign_in(page, gw)
    assert await page.locator("[data-stat=shared-state]").count() == 0
