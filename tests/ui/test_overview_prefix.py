"""The Overview shows each worker's prefix cache hit rate."""

from __future__ import annotations

import aiohttp

from tests.conftest import worker
from tests.ui.conftest import sign_in

SYSTEM = "You are a careful assistant who answers in short sentences. " * 12


async def test_each_worker_shows_its_prefix_cache_hit_rate(page, gateway, emulator) -> None:
    a = await emulator("a", models=["m:1"])
    b = await emulator("b", models=["m:1"])
    gw = await gateway([worker("a", a.url, type="openai"), worker("b", b.url, type="openai")])
    async with aiohttp.ClientSession() as http:
        for turn in range(4):  # one conversation: each turn resends the last, so its worker holds most of it
            messages = [{"role": "system", "content": SYSTEM}]
            messages += [{"role": "user", "content": f"question {n}"} for n in range(turn + 1)]
            body = {"model": "m:1", "messages": messages}
            async with http.post(f"{gw.url}/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
    await sign_in(page, gw)
    cells = {
        name: (await page.inner_text(f"#workers tr[data-worker={name}] td[data-hit-rate]")).strip()
        for name in ("a", "b")
    }
    served = [name for name, text in cells.items() if "%" in text]
    assert len(served) == 1, cells  # the conversation stayed on one worker; the other was sent nothing
    rate = int(cells[served[0]].split("%")[0])
    assert 50 <= rate < 100, cells  # three of its four turns found most of the prompt there (the first none)
    assert "prefix index's estimate" in cells[served[0]]  # the emulator reports no cached tokens of its own
    other = next(name for name in cells if name not in served)
    assert cells[other] == "\N{EN DASH}"  # nothing sent there: no rate
    header = await page.inner_text("#workers thead")
    assert "Prefix cache hits" in header
