"""Browser tests of the admin UI: Playwright (async API) driving Debian's Chromium, headless.

Playwright cannot download its own browser here, so it launches ``/usr/bin/chromium`` (``TURNOUT_CHROMIUM``
overrides). One browser serves the whole session; each test gets a fresh context (cookies, storage) and page.
Everything here runs on the session's event loop (the browser lives there), so this directory has its own
``gateway`` and ``emulator`` fixtures on that loop, with the same signatures as the root ones.

Fixtures:
- ``browser``: the shared Chromium.
- ``page``: a new context and page; ``page.set_default_timeout`` is 10 s so a broken test fails fast.
- ``gateway``, ``emulator``: as in ``tests/conftest.py`` (a real gateway app on a loopback port, Ollama emulators).
- ``sign_in(page, gw, lang=None)``: signs in through the form and lands on the Overview.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import playwright.async_api as playwright_api  # a dev dependency: fail loudly when it is missing
import pytest
import pytest_asyncio
from aiohttp import web

from tests.conftest import ADMIN_TOKEN, Gateway, serve_app
from tests.support.ollama_emulator import Behaviour, OllamaEmulator
from turnout.config import load_settings
from turnout.gateway.app import create_app

CHROMIUM = os.environ.get("TURNOUT_CHROMIUM", "/usr/bin/chromium")
_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).parents and inspect.iscoroutinefunction(getattr(item, "obj", None)):
            item.add_marker(pytest.mark.asyncio(loop_scope="session"), append=False)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Any]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"browser tests need Chromium at {CHROMIUM} (apt-get install chromium; scripts/test does)")
    async with playwright_api.async_playwright() as pw:
        chromium = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield chromium
        await chromium.close()


@pytest_asyncio.fixture(loop_scope="session")
async def page(browser: Any) -> AsyncIterator[Any]:
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    tab = await context.new_page()
    tab.set_default_timeout(10_000)
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    # "Failed to load resource" is how Chromium logs any 4xx answer, which some tests provoke on purpose
    tab.on(
        "console",
        lambda msg: (
            errors.append(msg.text)
            if msg.type == "error" and not msg.text.startswith("Failed to load resource")
            else None
        ),
    )
    yield tab
    await context.close()
    # A CSP violation or a script error is a bug even when the test's clicks happened to work.
    assert not errors, f"browser console errors: {errors}"


EmulatorFactory = Callable[..., Awaitable[OllamaEmulator]]
GatewayFactory = Callable[..., Awaitable[Gateway]]


@pytest_asyncio.fixture(loop_scope="session")
async def emulator() -> AsyncIterator[EmulatorFactory]:
    started: list[OllamaEmulator] = []

    async def make(name: str, models: list[str] | None = None, **behaviour: Any) -> OllamaEmulator:
        emu = OllamaEmulator(name, Behaviour(models=models or ["llama3.2:latest"], **behaviour))
        await emu.start()
        started.append(emu)
        return emu

    yield make
    for emu in started:
        await emu.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def gateway(tmp_path: Path) -> AsyncIterator[GatewayFactory]:
    runners: list[Gateway] = []

    async def make(workers: list[dict[str, Any]], env: dict[str, str] | None = None, **sections: Any) -> Gateway:
        data_dir = tmp_path / f"data{len(runners)}"
        config = {
            "storage": {"data_dir": str(data_dir)},
            "health": {"interval_s": 3600, "timeout_s": 2},
            "auth": {"open": True},
            "workers": workers,
            **sections,
        }
        path = tmp_path / f"config{len(runners)}.json"
        path.write_text(json.dumps(config))
        settings = load_settings(path, env=env or {})
        app: web.Application = create_app(settings, admin_token=ADMIN_TOKEN)
        url, runner = await serve_app(app, handler_cancellation=True)
        gw = Gateway(url, app, settings, data_dir, runner)
        runners.append(gw)
        return gw

    yield make
    for gw in runners:
        await gw.stop()


async def sign_in(page: Any, gw: Gateway, lang: str | None = None) -> None:
    """Sign in through the form (optionally switching the language first); ends on the Overview."""
    await page.goto(f"{gw.url}/admin")
    if lang is not None:
        await page.click(f"header form.lang button[value={lang}]")
        await page.wait_for_url(f"{gw.url}/admin")
        await page.wait_for_function(f"document.documentElement.lang === {lang!r}")
    await page.fill("#token", ADMIN_TOKEN)
    await page.press("#token", "Enter")
    await page.wait_for_url(f"{gw.url}/admin/overview")
