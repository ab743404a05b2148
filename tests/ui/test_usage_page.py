"""The Usage page in a real browser: after requests the charts appear (drawn from the series route), the
table below shows the same traffic per key and model, filters narrow both, and the CSV downloads work."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import ADMIN_TOKEN, worker
from tests.ui.conftest import sign_in
from turnout.admin.ui.usage_page import MAX_LINES, split_values

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def traffic(gw, key: str, model: str, count: int) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
        for _ in range(count):
            async with http.post(f"{gw.url}/api/chat", json=body) as r:
                assert r.status == 200


async def test_charts_table_filters_and_csv(page, gateway, emulator, tmp_path: Path) -> None:
    emu = await emulator("w1", ["qwen3:8b", "llama3.2:latest"])
    gw = await gateway([worker("w1", emu.url)], auth={"open": False})
    keys = {}
    async with aiohttp.ClientSession(headers=ADMIN) as http:
        for app in ("alpha", "beta"):
            async with http.post(f"{gw.url}/admin/api/keys", json={"app": app}) as r:
                keys[app] = (await r.json())["key"]
    await traffic(gw, keys["alpha"], "qwen3:8b", 3)
    await traffic(gw, keys["beta"], "llama3.2", 2)

    await sign_in(page, gw)
    await page.click("nav >> text=Usage")
    await page.wait_for_url(f"{gw.url}/admin/usage")
    await page.wait_for_selector("#charts[data-ready=yes]")
    assert await page.get_attribute("#charts", "data-requests") == "5"
    for chart in ("requests", "tokens", "latency"):
        assert await page.locator(f"#chart-{chart} canvas").count() == 1
        assert await page.locator(f"#chart-{chart} .u-legend").count() == 1
    assert await page.inner_text("[data-total=requests]") == "5"
    assert sorted(await page.locator("#usage-table tbody tr").evaluate_all("rs => rs.map(r => r.dataset.model)")) == [
        "llama3.2",
        "qwen3:8b",
    ]

    # one line per key, each the API's series for that key
    await page.select_option("#u-split", "key")
    await page.click("#usage-filters button[type=submit]")
    await page.wait_for_url("**split=key**")
    await page.wait_for_selector("#charts[data-ready=yes]")
    assert await page.get_attribute("#charts", "data-line-count") == "2"
    legend = await page.locator("#chart-requests .u-legend").inner_text()
    assert keys["alpha"][:10] in legend and keys["beta"][:10] in legend
    assert await page.get_attribute("#charts", "data-requests") == "5"
    await page.select_option("#u-split", "")

    # per key: the charts and the table follow the filter
    await page.select_option("#u-key", keys["beta"][:10])
    await page.select_option("#u-bucket", "minute")
    await page.click("#usage-filters button[type=submit]")
    await page.wait_for_url(f"**key={keys['beta'][:10]}**")
    await page.wait_for_selector("#charts[data-ready=yes]")
    assert await page.get_attribute("#charts", "data-requests") == "2"
    assert await page.inner_text("[data-total=requests]") == "2"

    async with page.expect_download() as info:
        await page.click("#csv-table")
    saved = tmp_path / "usage.csv"
    await (await info.value).save_as(saved)
    rows = list(csv.DictReader(io.StringIO(saved.read_text())))
    assert [(r["model"], r["requests"]) for r in rows] == [("llama3.2", "2")]
    async with page.expect_download() as info:
        await page.click("#csv-series")
    saved_series = tmp_path / "series.csv"
    await (await info.value).save_as(saved_series)
    series = list(csv.DictReader(io.StringIO(saved_series.read_text())))
    assert sum(int(r["requests"]) for r in series) == 2

    # a filter the API refuses is shown next to its field
    await page.goto(f"{gw.url}/admin/usage?since=whenever")
    await page.locator("#u-since-error").filter(has_text="cannot read time").wait_for()


async def test_no_traffic_yet(page, gateway) -> None:
    gw = await gateway([])
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/usage")
    await page.wait_for_selector("#charts[data-ready=yes]")
    assert await page.get_attribute("#charts", "data-requests") == "0"
    assert await page.locator("#no-usage").is_visible()


def _row(key: str | None, model: str, worker: str | None, requests: int, fallback_from: str | None = None) -> dict:
    return {"key": key, "model": model, "worker": worker, "requests": requests, "fallback_from": fallback_from}


ROWS = [
    _row("tk_a", "qwen3:8b", "gpu-a", 5),
    _row("tk_b", "mac/llama3.2", "mac", 3),
    _row("tk_b", "qwen3:8b", "gpu-a", 1, fallback_from="mac/llama3.2"),
    _row(None, "qwen3:8b", "gpu-b", 2),
]


@pytest.mark.parametrize(
    ("split", "expected"),
    [
        ("key", ["tk_a", "tk_b"]),  # busiest first; rows without a key get no line
        ("model", ["qwen3:8b", "mac/llama3.2"]),
        ("worker", ["gpu-a", "gpu-b"]),  # an endpoint is not a worker
        ("endpoint", ["mac"]),
    ],
)
def test_split_values(split: str, expected: list[str]) -> None:
    assert split_values(ROWS, split, {"mac"}) == expected


def test_split_values_keeps_the_busiest() -> None:
    rows = [_row(f"tk_{i}", "m", "w", i) for i in range(1, 10)]
    assert split_values(rows, "key", set()) == [f"tk_{i}" for i in range(9, 9 - MAX_LINES, -1)]
