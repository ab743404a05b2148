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
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import playwright.async_api as playwright_api  # a dev dependency: fail loudly when it is missing
import pytest
import pytest_asyncio

from tests.conftest import ADMIN_TOKEN, EmulatorFactory, Gateway, GatewayFactory, emulators, gateways

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


@pytest_asyncio.fixture(loop_scope="session")
async def emulator() -> AsyncIterator[EmulatorFactory]:
    async with emulators() as make:
        yield make


@pytest_asyncio.fixture(loop_scope="session")
async def gateway(tmp_path: Path) -> AsyncIterator[GatewayFactory]:
    async with gateways(tmp_path) as make:
        yield make


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
