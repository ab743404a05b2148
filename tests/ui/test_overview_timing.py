"""The Overview shows where proxied requests' time went over the last minutes: each phase's median and 90th
percentile, as bars on one scale and as numbers, in both catalogs."""

from __future__ import annotations

import re

import aiohttp

from tests.conftest import worker
from tests.ui.conftest import sign_in


async def test_the_overview_shows_each_phases_median_and_90th_percentile(page, gateway, emulator) -> None:
    # a worker that takes its time: 20 ms a token, so the first token and the whole answer are far apart
    emu = await emulator("slow", models=["m:1"], token_delay_s=0.02, tokens=5)
    gw = await gateway([worker("slow", emu.url, type="openai")])
    async with aiohttp.ClientSession() as http:
        for stream in (False, False, True, True, True):
            body = {"model": "m:1", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
            async with http.post(f"{gw.url}/v1/chat/completions", json=body) as r:
                assert r.status == 200
                await r.read()
    await sign_in(page, gw)
    rows = {await row.get_attribute("data-phase"): row for row in await page.query_selector_all("#timing tbody tr")}
    assert list(rows) == ["queue", "hold", "upstream", "ttft_stream", "total_stream", "total_whole"]

    async def cell(phase: str, what: str) -> str:
        """A row's cell (``count``, ``p50``, ``p90``), or the whole row's text (``row``)."""
        found = rows[phase] if what == "row" else await rows[phase].query_selector(f"td[data-{what}]")
        assert found is not None
        return str(await found.inner_text()).strip()

    assert await cell("queue", "count") == "5" and await cell("total_whole", "count") == "2"
    assert await cell("ttft_stream", "count") == "3" and await cell("total_stream", "count") == "3"
    assert await cell("hold", "count") == "0" and "none" in await cell("hold", "row")  # nobody was held
    # a whole stream took its five tokens (100 ms at least); its first token came before
    whole = float(re.sub(r"[^\d.]", "", await cell("total_stream", "p50")))
    first = float(re.sub(r"[^\d.]", "", await cell("ttft_stream", "p50")))
    assert whole >= 90 and first < whole
    # the bars: one scale, the longest 90th percentile the full width; a median never past its 90th percentile
    widths = {}
    for phase in ("queue", "ttft_stream", "total_stream", "total_whole"):
        p90 = await rows[phase].query_selector("rect.p90")
        p50 = await rows[phase].query_selector("rect.p50")
        assert p90 is not None and p50 is not None
        widths[phase] = (float(await p50.get_attribute("width")), float(await p90.get_attribute("width")))
        assert widths[phase][0] <= widths[phase][1]
    assert max(w90 for _, w90 in widths.values()) == 240
    assert widths["queue"][1] < widths["total_stream"][1]
    label = await (await rows["total_stream"].query_selector("svg")).get_attribute("aria-label")  # type: ignore[union-attr]
    assert label is not None and label.startswith("median ")
    # the other window, and back through the polled fragment (it keeps the window)
    await page.click("section.timing .windows a")
    await page.wait_for_url(f"{gw.url}/admin/overview?window=15")
    assert "15 minutes" in await page.inner_text("section.timing p")
    assert await page.get_attribute("#overview-body", "hx-get") == "/admin/overview/fragment?window=15"


async def test_the_timing_panel_in_german_and_without_traffic(page, gateway) -> None:
    gw = await gateway([])
    await sign_in(page, gw, lang="de")
    assert await page.inner_text("#timing-title") == "Wohin die Zeit ging"
    assert "Keine weitergeleiteten Anfragen in den letzten 5 Minuten." in await page.inner_text("#timing-none")
