"""Admin UI at fleet scale: the placement matrix of M models x W workers in Chromium, and a cell toggle.

Starts W emulated Ollama workers (each holding most of M models, a few loaded), a real gateway, and headless
Chromium (``/usr/bin/chromium`` or ``TURNOUT_CHROMIUM``), then prints one table:

- server render: ``GET /admin/placement`` over HTTP (the HTML of every cell), median;
- page load in Chromium: navigation start to the first frame painted after ``load`` (parse, style, layout of
  the whole matrix, and the page's script set up), median;
- toggle round trip in Chromium: click to the re-rendered cell painted (the toggle API call with ``If-Match``,
  then the cell fragment), median and p95, toggling each cell twice so the state ends where it began;
- the same toggle as a bare API call (aiohttp client), for comparison.

    .venv/bin/python bench/ui.py                 # --models 200 --workers 50 --loads 5 --toggles 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from playwright.async_api import async_playwright  # noqa: E402
from tests.conftest import serve_app  # noqa: E402
from tests.support.ollama_emulator import Behaviour, OllamaEmulator  # noqa: E402

from bench.prefix import pct  # noqa: E402  (every bench's percentiles: one formula)
from turnout.config import load_settings  # noqa: E402
from turnout.wiring import create_app  # noqa: E402

TOKEN = "bench-admin-token"
CHROMIUM = os.environ.get("TURNOUT_CHROMIUM", "/usr/bin/chromium")

PAINTED_AFTER_LOAD = """async () => {
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  return performance.now();  // ms since navigation start
}"""

TOGGLE = """async ([row, col]) => {
  const td = document.querySelector('#matrix tbody').rows[row].cells[col];
  td.scrollIntoView({block: "center", inline: "center"});  // a user clicks a cell they can see
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const done = new Promise(r => document.getElementById('matrix')
    .addEventListener('turnout:toggled', e => r(e.detail), {once: true}));
  const t0 = performance.now();
  td.click();
  const detail = await done;
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  if (detail.error) throw new Error(detail.error);
  return performance.now() - t0;
}"""


async def run(models: int, workers: int, loads: int, toggles: int) -> list[tuple[str, str, str]]:
    names = [f"family{i // 8}:{i % 8}b" for i in range(models)]
    emulators = []
    for w in range(workers):
        held = [n for i, n in enumerate(names) if (i + w) % 4 != 0]  # 3/4 installed, a different quarter missing
        emu = OllamaEmulator(f"w{w:02d}", Behaviour(models=held, loaded=held[w % len(held) : w % len(held) + 2]))
        await emu.start()
        emulators.append(emu)
    cfg: list[dict[str, Any]] = [{"name": e.name, "url": e.url, "type": "ollama"} for e in emulators]
    for i, worker in enumerate(cfg[: workers // 5]):  # some config rules, exact and prefix
        worker["model_placement"] = {"mode": "allow_all", "denied_models": [f"family{i}:*", names[-1 - i]]}
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.json"
        config.write_text(
            json.dumps(
                {
                    "storage": {"data_dir": str(Path(tmp) / "data")},
                    "health": {"interval_s": 3600, "timeout_s": 5},
                    "workers": cfg,
                }
            )
        )
        app = create_app(load_settings(config, env={}), admin_token=TOKEN)
        url, runner = await serve_app(app)
        try:
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
                page = await (await browser.new_context(viewport={"width": 1400, "height": 900})).new_page()
                await page.goto(f"{url}/admin")
                await page.fill("#token", TOKEN)
                await page.press("#token", "Enter")
                await page.wait_for_url(f"{url}/admin/overview")
                cookies = {c["name"]: c["value"] for c in await page.context.cookies()}

                server, size = [], 0
                async with aiohttp.ClientSession(cookies=cookies) as http:
                    for _ in range(loads):
                        t0 = time.perf_counter()
                        async with http.get(f"{url}/admin/placement") as r:
                            body = await r.read()
                        server.append((time.perf_counter() - t0) * 1000)
                        size = len(body)
                cells = body.count(b'<td class="c ')
                rows.append(("server render (GET /admin/placement)", f"{statistics.median(server):.0f} ms", ""))

                load = []
                for _ in range(loads):
                    await page.goto(f"{url}/admin/placement", wait_until="load")
                    load.append(await page.evaluate(PAINTED_AFTER_LOAD))
                rows.append(
                    (
                        f"page load to first paint, {models} x {workers} ({cells} cells, {size / 1e6:.1f} MB)",
                        f"{statistics.median(load):.0f} ms",
                        f"min {min(load):.0f}, max {max(load):.0f} ms",
                    )
                )

                spots = [(1 + (i * 37) % (models - 1), 1 + (i * 11) % workers) for i in range(toggles)]
                taken = []
                for row, col in spots:
                    for _ in range(2):  # twice: the exception is added, then removed
                        taken.append(await page.evaluate(TOGGLE, [row, col]))
                rows.append(
                    (
                        "toggle round trip in Chromium (click to cell painted)",
                        f"{statistics.median(taken):.0f} ms",
                        f"p95 {pct(taken, 0.95):.0f} ms, n={len(taken)}",
                    )
                )

                api, admin = [], {"Authorization": f"Bearer {TOKEN}"}
                async with aiohttp.ClientSession() as http:
                    for i in range(toggles):
                        model = names[(i * 37) % models]
                        for _ in range(2):
                            t0 = time.perf_counter()
                            async with http.post(
                                f"{url}/admin/api/placement/workers/w01/toggle", json={"model": model}, headers=admin
                            ) as r:
                                await r.read()
                                assert r.status == 200, r.status
                            api.append((time.perf_counter() - t0) * 1000)
                rows.append(
                    (
                        "toggle as a bare API call (aiohttp client)",
                        f"{statistics.median(api):.1f} ms",
                        f"p95 {pct(api, 0.95):.1f} ms",
                    )
                )
                await browser.close()
        finally:
            await runner.cleanup()
            for emu in emulators:
                await emu.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument("--loads", type=int, default=5, help="page loads measured")
    parser.add_argument("--toggles", type=int, default=30, help="cells toggled (twice each)")
    args = parser.parse_args()
    rows = asyncio.run(run(args.models, args.workers, args.loads, args.toggles))
    print(f"\nadmin UI, placement matrix {args.models} models x {args.workers} workers, headless Chromium\n")
    print("| measure | median | spread |")
    print("|---|---:|---|")
    for name, value, spread in rows:
        print(f"| {name} | {value} | {spread} |")


if __name__ == "__main__":
    main()
