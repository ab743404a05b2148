"""Regenerate docs/screenshots/: a real gateway with emulated Ollama workers, some traffic, and one PNG per page.

Run ``scripts/screenshots`` (it uses ``.venv``); needs Chromium (``/usr/bin/chromium`` or ``TURNOUT_CHROMIUM``).
Pages whose route is not registered yet are skipped and named. ``--out DIR`` writes elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from playwright.async_api import async_playwright  # noqa: E402
from scripts.screenshot_state import seed_operator_pages, start_pool  # noqa: E402
from tests.conftest import free_port, serve_app  # noqa: E402
from tests.support.ollama_emulator import Behaviour, OllamaEmulator  # noqa: E402

from turnout.config import load_settings  # noqa: E402
from turnout.wiring import create_app  # noqa: E402

TOKEN = "screenshot-admin-token"
CHROMIUM = os.environ.get("TURNOUT_CHROMIUM", "/usr/bin/chromium")

FLEET = {
    "mac-studio": (
        ["llama3.2:latest", "qwen3:8b", "gemma3:12b", "nomic-embed-text:latest", "mistral-small:24b"],
        ["llama3.2:latest"],
    ),
    "gpu-a": (["qwen3:8b", "qwen3:32b", "llama3.3:70b", "deepseek-r1:14b", "gemma3:12b"], ["qwen3:32b"]),
    "gpu-b": (["qwen3:8b", "qwen3:32b", "llama3.3:70b", "deepseek-r1:14b", "codestral:22b"], ["llama3.3:70b"]),
}

# (file name, path, route name that must exist)
PAGES = [
    ("signin", "/admin", "ui.signin"),
    ("overview", "/admin/overview", "ui.overview"),
    ("placement", "/admin/placement", "ui.placement"),
    ("placement-worker", "/admin/placement/workers/gpu-b", "ui.placement.worker"),
    ("endpoints", "/admin/endpoints", "ui.endpoints"),
    ("models", "/admin/models", "ui.models"),
    ("keys", "/admin/keys", "ui.keys"),
    ("usage", "/admin/usage", "ui.usage"),
    ("batches", "/admin/batches", "ui.batches"),
    ("audit", "/admin/audit", "ui.audit"),
    ("pools", "/admin/pools", "ui.pools"),
    ("persistence", "/admin/persistence", "ui.persistence"),
]


async def seed(url: str) -> None:
    """Some state worth looking at: UI exceptions, model aliases, a key, traffic for usage and the overview."""
    admin = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as http:
        for alias, model in (
            ("claude-sonnet-4-5", "qwen3:32b"),
            ("claude-haiku-4-5", "qwen3:8b"),
            ("gpt-5-codex", "deepseek-r1:14b"),  # over the config file's
            ("o4-mini", "phi4:14b"),  # a model no worker has
        ):
            async with http.put(f"{url}/admin/api/aliases/{alias}", json={"model": model}, headers=admin) as r:
                r.raise_for_status()
        for worker, model in (("gpu-a", "deepseek-r1:14b"), ("mac-studio", "mistral-small:24b")):
            async with http.post(
                f"{url}/admin/api/placement/workers/{worker}/toggle", json={"model": model}, headers=admin
            ) as r:
                r.raise_for_status()
        new_key = {"app": "chat-ui", "tenant": "research"}
        async with http.post(f"{url}/admin/api/keys", json=new_key, headers=admin) as r:
            key = (await r.json())["key"]
        for i in range(24):
            model = ("llama3.2", "qwen3:8b", "claude-sonnet-4-5", "llama3.3:70b")[i % 4]
            body = {"model": model, "messages": [{"role": "user", "content": f"hello {i}"}], "stream": i % 3 == 0}
            async with http.post(
                f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            ) as r:
                await r.read()
        await seed_batches(http, url, key)
        # multi-turn conversations sharing a system prompt: the workers' prefix cache hit rates
        system = "You are the research team's assistant. Cite sources and keep answers short. " * 10
        for turn in range(5):
            for conversation in range(3):
                messages = [{"role": "system", "content": system}]
                messages += [{"role": "user", "content": f"question {n} of {conversation}"} for n in range(turn + 1)]
                body = {"model": "qwen3:8b", "messages": messages, "stream": False}
                async with http.post(
                    f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
                ) as r:
                    await r.read()


async def seed_batches(http: aiohttp.ClientSession, url: str, key: str) -> None:
    """Batch API batches for the Batches page: one completed; one still running, its lines for a model that only the
    down worker may hold waiting for it (503: a batch waits and sends them again); one cancelled right away."""
    auth = {"Authorization": f"Bearer {key}"}
    made = []
    for lines, odd, cancel in ((12, 0, False), (40, 5, False), (300, 0, True)):
        rows = [
            {
                "custom_id": f"eval-{n}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "phi4:14b" if odd and n % odd == 1 else "qwen3:8b",
                    "messages": [{"role": "user", "content": "hi"}],
                },
            }
            for n in range(lines)
        ]
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", "".join(json.dumps(r) + "\n" for r in rows).encode(), filename="evals.jsonl")
        async with http.post(f"{url}/v1/files", data=form, headers=auth) as r:
            r.raise_for_status()
            file_id = (await r.json())["id"]
        body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        async with http.post(f"{url}/v1/batches", json=body, headers=auth) as r:
            r.raise_for_status()
            made.append((await r.json())["id"])
        if cancel:
            async with http.post(f"{url}/v1/batches/{made[-1]}/cancel", headers=auth) as r:
                r.raise_for_status()
    for _ in range(200):  # the first and the last end within seconds (emulated workers)
        statuses = []
        for batch_id in (made[0], made[-1]):
            async with http.get(f"{url}/v1/batches/{batch_id}", headers=auth) as r:
                statuses.append((await r.json())["status"])
        if statuses == ["completed", "cancelled"]:
            return
        await asyncio.sleep(0.1)


async def main(out: Path, width: int = 1400) -> None:
    emulators = []
    for name, (models, loaded) in FLEET.items():
        # engines that take their time (a prefill, then 15 ms a token), so the Overview's timing panel shows some
        emu = OllamaEmulator(
            name, Behaviour(models=models, loaded=loaded, tokens=8, token_delay_s=0.015, prefill_s_per_kib=0.2)
        )
        await emu.start()
        emulators.append(emu)
    workers: list[dict[str, Any]] = [{"name": e.name, "url": e.url, "type": "ollama"} for e in emulators]
    workers[2]["model_placement"] = {"mode": "whitelist", "allowed_models": ["qwen3:*", "llama3.3:70b"]}
    workers.append({"name": "laptop", "url": f"http://127.0.0.1:{free_port()}", "type": "ollama"})
    with tempfile.TemporaryDirectory() as tmp:
        pools, stop_pool = await start_pool(Path(tmp))
        config = Path(tmp) / "config.json"
        config.write_text(
            json.dumps(
                {
                    "storage": {"data_dir": str(Path(tmp) / "data")},
                    "health": {"interval_s": 3600, "timeout_s": 1},
                    "workers": workers,
                    "pools": pools,
                    "aliases": {"gpt-5-codex": "qwen3:32b", "gpt-4o": "llama3.3:70b"},
                    "batches": {"poll_s": 0.2, "lines_in_flight": 2},
                }
            )
        )
        private_ok = {"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true"}  # the endpoints are on loopback
        app = create_app(load_settings(config, env=private_ok), admin_token=TOKEN)
        url, runner = await serve_app(app)
        try:
            await seed(url)
            emulators += await seed_operator_pages(url, TOKEN, Path(tmp) / "data", Path(tmp))
            named = app.router.named_resources()
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
                context = await browser.new_context(viewport={"width": width, "height": 860}, device_scale_factor=1)
                page = await context.new_page()
                await page.goto(f"{url}/admin")
                await page.screenshot(path=str(out / "signin.png"))
                await page.fill("#token", TOKEN)
                await page.press("#token", "Enter")
                await page.wait_for_url(f"{url}/admin/overview")
                written, skipped = ["signin"], []
                for name, path, route in PAGES[1:]:
                    if route not in named:
                        skipped.append(name)
                        continue
                    await page.goto(url + path)
                    await page.wait_for_load_state("networkidle")
                    if name == "placement":  # show a cell's explanation, as hovering does
                        await page.hover("#matrix tbody tr:nth-child(3) td:nth-of-type(2)")
                    await page.screenshot(path=str(out / f"{name}.png"), full_page=name != "placement")
                    written.append(name)
                # the German catalog on the Overview (its timing panel) and on the busiest page (the operators'
                # "Persistenz" is in its nav)
                await page.goto(f"{url}/admin/overview")
                await page.click("header form.lang button[value=de]")
                await page.wait_for_function("document.documentElement.lang === 'de'")
                await page.screenshot(path=str(out / "overview-de.png"), full_page=True)
                written.append("overview-de")
                await page.goto(f"{url}/admin/placement")
                await page.hover("#matrix tbody tr:nth-child(2) td:nth-of-type(3)")
                await page.screenshot(path=str(out / "placement-de.png"))
                written.append("placement-de")
                if "ui.batches" in named:  # and the Batches page in German
                    await page.goto(f"{url}/admin/batches")
                    await page.wait_for_load_state("networkidle")
                    await page.screenshot(path=str(out / "batches-de.png"), full_page=True)
                    written.append("batches-de")
                await page.goto(f"{url}/admin/keys")  # the Keys page in German (priority classes)
                await page.wait_for_load_state("networkidle")
                await page.screenshot(path=str(out / "keys-de.png"), full_page=True)
                written.append("keys-de")
                await browser.close()
            print("wrote", ", ".join(f"{out}/{n}.png" for n in written))
            if skipped:
                print("skipped (no such page yet):", ", ".join(skipped))
        finally:
            await runner.cleanup()
            await stop_pool()
            for emu in emulators:
                await emu.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--width", type=int, default=1400, help="the window's width in CSS pixels (a narrow layout)")
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    asyncio.run(main(out, args.width))
