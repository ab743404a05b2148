"""The Runtime pools page in a real browser, against the gateway's local controller, a real runtime agent and
real llama.cpp engines: pools and their engines (phase, port, restarts, last error), claims by phase, and the
claim events; it refreshes itself while the claims change."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from tests.runtime.conftest import AgentStarter, agents
from tests.support.claims import claim_yaml
from tests.ui.conftest import sign_in
from turnout.controller.local import ClaimFiles, load_claim_documents


@pytest_asyncio.fixture(loop_scope="session")
async def start_agent(tmp_path: Path) -> AsyncIterator[AgentStarter]:
    async with agents(tmp_path) as start:  # the runtime tests' agents, on the browser's session loop
        yield start


async def test_pools_engines_claims_and_events(page, gateway, start_agent, tiny_model: Path, tmp_path: Path) -> None:
    url, _ = await start_agent()
    labels = {"pool": "cpu", "pool.aibrix.ai/enabled": "true"}
    gw = await gateway([], pools={"agents": [{"name": "cpu-0", "agent_url": url, "labels": labels}], "interval_s": 0.2})
    files = ClaimFiles(gw.settings.data_dir)
    for name, model in (("alpha", tiny_model), ("broken", tmp_path / "missing.gguf")):
        for doc in load_claim_documents(claim_yaml(name, model)):
            files.apply(doc)
    await sign_in(page, gw)
    await page.click("nav >> text=Runtime pools")
    await page.wait_for_url(f"{gw.url}/admin/pools")
    pool = page.locator("section[data-pool=cpu-0]")
    await pool.wait_for()
    assert url in await pool.inner_text()
    # the page polls: the claim becomes Active with a port, the broken one Failed with its restarts and error
    await page.locator("tr[data-claim=alpha][data-phase=Active]").wait_for(timeout=60_000)
    alpha = pool.locator("tr[data-engine=alpha]")
    assert (await alpha.locator("[data-port]").inner_text()).isdigit()
    await page.locator("tr[data-claim=broken][data-phase=Failed]").wait_for(timeout=60_000)
    broken = pool.locator("tr[data-engine=broken]")
    await broken.locator("[data-restarts]").filter(has_text=re.compile(r"^[1-9][0-9]*$")).wait_for(timeout=30_000)
    assert "engine exited" in await broken.locator("[data-last-error]").inner_text()
    assert await page.locator("#claims-table tr[data-claim=alpha]").locator("text=serving").count() == 1
    events = page.locator("#events-table tbody tr")
    assert await events.count() >= 2
    assert await page.locator("#events-table tr.warning").count() >= 1  # the failure is a Warning event


async def test_no_pools_configured(page, gateway) -> None:
    gw = await gateway([])
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/pools")
    assert "not configured" in await page.inner_text("#pools-off")
