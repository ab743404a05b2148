"""Prefix routing against real llama.cpp engines (llama.cpp's own server, one slot each, on the tiny generated
model): each conversation stays on the engine that holds its beginning, and the engine itself says it reused it
(``timings.cache_n`` in its last stream chunk: the prompt tokens it took from its cache)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import Engine, GatewayFactory, start_llama, worker
from turnout.gateway.keys import FLEET

SYSTEMS = {
    "A": "You are the first assistant. Keep to the point and use short words only. " * 2,
    "B": "Answer as the second assistant would, in other words entirely, and be kind. " * 2,
}


@pytest.fixture
def engines(tiny_model: Path, tmp_path: Path) -> Iterator[list[Engine]]:
    started = []
    try:
        for n in range(2):
            started.append(start_llama(tiny_model, "tiny", tmp_path / f"engine{n}.log"))
        yield started
    finally:
        for engine in started:
            engine.stop()


async def test_each_conversation_stays_on_the_engine_that_holds_it(
    engines: list[Engine], gateway: GatewayFactory
) -> None:
    workers = [worker(f"e{n}", e.url, type="openai", slots=1) for n, e in enumerate(engines)]
    gw = await gateway(workers, routing={"explain_header": True, "prefix_block_bytes": 32})
    where: dict[str, list[str]] = {"A": [], "B": []}
    reused: dict[str, list[int]] = {"A": [], "B": []}
    async with aiohttp.ClientSession() as http:
        for turn in range(3):
            for name, system in SYSTEMS.items():
                messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
                for earlier in range(turn + 1):
                    messages.append({"role": "user", "content": f"question {earlier}?"})
                    if earlier < turn:
                        messages.append({"role": "assistant", "content": f"answer {earlier}."})
                body = {"model": "tiny", "messages": messages, "max_tokens": 4, "stream": True, "seed": 1}
                async with http.post(f"{gw.url}/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    frames = [json.loads(line[6:]) async for line in resp.content if line.startswith(b"data: {")]
                    where[name].append(resp.headers["X-Turnout-Route"])
                    reused[name] += [f["timings"]["cache_n"] for f in frames if "timings" in f]
    chosen = {name: {route.split(";")[0] for route in routes} for name, routes in where.items()}
    assert chosen["A"] != chosen["B"] and all(len(c) == 1 for c in chosen.values()), where
    assert all(route.split("; ")[1].startswith("prefix ") for routes in where.values() for route in routes[1:])
    # the engines' own word: every later turn reused the beginning it was sent before
    for name, counts in reused.items():
        assert len(counts) == 3 and all(n >= 30 for n in counts[1:]), (name, counts)
    # and the speeds learned mean what they say: a prefill rate from each conversation's first turn
    for state in gw.app[FLEET].workers.values():
        assert state.learned["tiny"].prefill is not None, state.name
