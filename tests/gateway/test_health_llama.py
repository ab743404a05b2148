"""Health checks that do not hurt the worker they check: a real llama.cpp server (llama-server) with one slot.

llama-server answers ``/health`` and ``/v1/models`` from its HTTP threads, outside the slot queue
(tools/server/server.cpp), so a probe neither waits for a busy slot nor ends its stream; the first test pins
that. (llama-cpp-python's server, which served every route behind one lock and by default ended a running stream
when another request waited for it, is why an OpenAI-style worker is probed only when idle: core/health.py. No
engine of that kind runs in the suite any more; the rule itself is tested in tests/core/test_health.py.) The
others check that polls during a long answer leave it whole and the worker healthy.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from tests.conftest import Clients, Engine, GatewayFactory, eventually, start_llama, worker
from turnout.gateway.keys import FLEET, POLLER

TOKENS = 200
# The tiny model's end-of-text tokens ("</s>" = 2, "<|im_end|>" = 4) are biased away, so every answer
# runs to max_tokens (finish_reason "length") and a cut-short one shows.
NO_EOS: dict[str, Any] = {"logit_bias": {"2": -100, "4": -100}}
MESSAGES = [{"role": "user", "content": "hello world"}]


async def test_a_probe_during_a_stream_is_answered_and_leaves_it_whole(llama_engine: Engine) -> None:
    """Without the gateway: a GET /v1/models while the engine streams is answered, and the stream runs on to
    max_tokens."""
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "max_tokens": TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
        **NO_EOS,
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{llama_engine.url}/v1/chat/completions", json=body) as resp,
    ):
        events = [await resp.content.readline()]
        async with http.get(f"{llama_engine.url}/v1/models") as probe:
            assert probe.status == 200
        events += [line async for line in resp.content]
    data = b"".join(e for e in events if e.startswith(b"data: {"))
    assert b'"finish_reason":"length"' in data and b'"completion_tokens":%d' % TOKENS in data


async def test_polls_during_a_long_stream_do_not_cut_it(
    llama_engine: Engine, gateway: GatewayFactory, clients: Clients
) -> None:
    gw = await gateway(
        [worker("llama", llama_engine.url, type="openai")],
        health={"interval_s": 0.2, "timeout_s": 1, "failures_to_down": 1},
    )
    state, poller = gw.app[FLEET].workers["llama"], gw.app[POLLER]
    assert state.healthy
    client = clients.openai(gw.url)
    stream = await client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=NO_EOS,
    )
    chunks = [await anext(stream)]
    assert state.in_flight == 1  # generating
    listed = state.inventory_at
    polled_during = 0
    async for chunk in stream:
        chunks.append(chunk)
        if len(chunks) % 20 == 1:  # besides the 0.2 s background loop: a poll round every 20 chunks
            await poller.poll_all()
            polled_during += state.inventory_at != listed and state.in_flight == 1
            listed = state.inventory_at
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = [c.usage for c in chunks if c.usage is not None]
    assert finish == ["length"] and [u.completion_tokens for u in usage] == [TOKENS]  # the whole answer
    assert state.healthy and state.failures == 0 and state.request_failures == 0
    # the probes really ran while it streamed: llama.cpp's server (its listing says so) is probed beside its
    # requests (an unnamed OpenAI-style server only while idle)
    assert state.engine_family == "llamacpp" and polled_during >= 3, polled_during


async def test_what_a_llama_server_runs_at_once_is_read_from_it(
    llama_engine: Engine, tiny_model: Path, gateway: GatewayFactory, tmp_path: Path
) -> None:
    """Nothing declared: each server's /props says its slots (--parallel), and the gateway takes them from it."""
    one = start_llama(tiny_model, "tiny", tmp_path / "one.log", "--parallel", "1")
    try:
        gw = await gateway([worker("two", llama_engine.url, type="openai"), worker("one", one.url, type="openai")])
        fleet = gw.app[FLEET]
        for name, slots in (("two", 2), ("one", 1)):
            figure = fleet.workers[name].parallelism("tiny", 0.0)
            assert (figure.slots, figure.source.value) == (slots, "engine"), (name, figure)
            assert figure.why == f"llama.cpp's /props: total_slots {slots}"
    finally:
        one.stop()


async def test_a_probe_never_marks_a_busy_worker_down(
    llama_engine: Engine, gateway: GatewayFactory, clients: Clients
) -> None:
    """A long non-streamed answer runs while the gateway polls with a 10 ms timeout: a probe that times out while
    the worker's request progresses does not count (core/health.py), so the worker stays healthy."""
    gw = await gateway(
        [worker("llama", llama_engine.url, type="openai")],
        health={"interval_s": 3600, "timeout_s": 0.01, "failures_to_down": 1},
    )
    state, poller = gw.app[FLEET].workers["llama"], gw.app[POLLER]

    async def idle_and_healthy() -> bool:  # 10 ms is tight for an idle probe on a loaded machine: poll again
        if not state.healthy:
            await poller.poll_all()
        return state.healthy

    await eventually(idle_and_healthy, "an idle probe to succeed", limit_s=30)
    client = clients.openai(gw.url)
    answer = asyncio.create_task(
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=TOKENS, extra_body=NO_EOS)
    )

    async def busy() -> bool:
        return state.in_flight == 1

    await eventually(busy, "the request to reach the worker", limit_s=30, every_s=0.002)
    for _ in range(5):
        await poller.poll_all()
    assert state.in_flight == 1 and state.healthy  # still generating, still healthy
    reply = await answer
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and abs(reply.usage.completion_tokens - TOKENS) <= 5  # as llama.cpp counts them
    assert state.healthy and state.failures == 0
