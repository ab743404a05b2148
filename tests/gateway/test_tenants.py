"""Tenant fairness: per-tenant concurrency caps and weighted round-robin of the wait queue."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from tests.conftest import EmulatorFactory, Gateway, GatewayFactory, worker
from turnout.gateway.keys import KEYS


def key_for(gw: Gateway, tenant: str) -> str:
    return gw.app[KEYS].create(
        app=f"app-{tenant}", tenant=tenant, scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=time.time()
    )[1]


async def run_all(gw: Gateway, plan: list[tuple[str, float]], keys: dict[str, str]) -> list[str]:
    """Start one request per (tenant, delay); return tenants in the order their answers finished."""
    done: list[str] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def one(tenant: str, delay: float) -> None:
            await asyncio.sleep(delay)
            body = {"model": "m:1", "messages": [], "stream": False}
            async with http.post(
                f"{gw.url}/api/chat", json=body, headers={"Authorization": f"Bearer {keys[tenant]}"}
            ) as r:
                assert r.status == 200, await r.text()
                done.append(tenant)

        await asyncio.gather(*(one(t, d) for t, d in plan))
    return done


async def test_a_burst_does_not_starve_another_tenant(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["m:1"], tokens=3, token_delay_s=0.01)
    gw = await gateway([worker("a", emu.url, max_concurrent=1)], auth={"open": False})
    keys = {t: key_for(gw, t) for t in ("A", "B")}
    order = await run_all(gw, [("A", 0.0)] * 8 + [("B", 0.02)] * 2, keys)
    assert sorted(order) == ["A"] * 8 + ["B"] * 2
    assert max(i for i, t in enumerate(order) if t == "B") <= 4  # FIFO alone would put them 9th and 10th


async def test_weights_share_the_queue(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["m:1"], tokens=2, token_delay_s=0.01)
    gw = await gateway(
        [worker("a", emu.url, max_concurrent=1)], auth={"open": False}, tenants={"A": {"weight": 3}, "B": {"weight": 1}}
    )
    keys = {t: key_for(gw, t) for t in ("A", "B")}
    order = await run_all(gw, [("A", 0.0)] + [("A", 0.01)] * 8 + [("B", 0.01)] * 8, keys)
    window = order[1:9]  # while both tenants wait: about 3 A per B
    assert 5 <= window.count("A") <= 7


async def test_tenant_cap(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["m:1"], tokens=4, token_delay_s=0.02)
    gw = await gateway(
        [worker("a", emu.url, max_concurrent=8)], auth={"open": False}, tenants={"A": {"max_concurrent": 1}}
    )
    keys = {t: key_for(gw, t) for t in ("A", "B")}
    order = await run_all(gw, [("A", 0.0)] * 3 + [("B", 0.01)], keys)
    assert order.index("B") <= 1  # B is not held behind A's cap
    assert emu.peak_active == 2  # one A plus the B
