"""Health checks that do not hurt the worker they check: a real llama.cpp server with its default flags.

llama_cpp.server serves every route behind one lock, and by default (``interrupt_requests``) a running
stream ends with ``[DONE]`` as soon as another request waits for it, ``/v1/models`` included
(llama_cpp/server/app.py, ``get_llama_proxy`` and ``get_event_publisher``). The first test pins that
upstream behaviour, so the others would fail if the gateway probed a busy worker.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.conftest import Clients, Engine, GatewayFactory, eventually, worker
from turnout.gateway.keys import FLEET, POLLER

TOKENS = 200
# The tiny model's end-of-text tokens ("</s>" = 2, "<|im_end|>" = 4) are biased away, so every answer
# runs to max_tokens (finish_reason "length") and a cut-short one shows.
NO_EOS: dict[str, Any] = {"logit_bias": {"2": -100, "4": -100}}
MESSAGES = [{"role": "user", "content": "hello world"}]


async def test_a_probe_during_a_stream_cuts_it_short_upstream(llama_engine: Engine) -> None:
    """The premise, without the gateway: one GET /v1/models while the engine streams ends the stream."""
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": TOKENS, "stream": True, **NO_EOS}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{llama_engine.url}/v1/chat/completions", json=body) as resp,
    ):
        events = [await resp.content.readline()]
        async with http.get(f"{llama_engine.url}/v1/models") as probe:
            assert probe.status == 200  # answered as soon as the stream gave the lock up
        events += [line async for line in resp.content]
    data = [e for e in events if e.startswith(b"data: {")]
    assert len(data) < TOKENS / 2 and b'"finish_reason": "length"' not in b"".join(data)  # silently cut


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
        model="tiny", messages=MESSAGES, max_tokens=TOKENS, stream=True, extra_body=NO_EOS
    )
    chunks = [await anext(stream)]
    assert state.in_flight == 1  # generating: the engine holds its lock
    async for chunk in stream:
        chunks.append(chunk)
        if len(chunks) % 20 == 1:  # besides the 0.2 s background loop: a poll round every 20 chunks
            await poller.poll_all()
    assert chunks[-1].choices[0].finish_reason == "length"
    # llama.cpp sends one chunk per token (empty content for a byte of an unfinished character) plus the
    # role and finish chunks; a stream cut short by a probe stops after one or two.
    assert len(chunks) >= TOKENS
    assert state.healthy and state.failures == 0 and state.request_failures == 0


async def test_a_probe_never_marks_a_busy_worker_down(
    llama_engine: Engine, gateway: GatewayFactory, clients: Clients
) -> None:
    """A long non-streamed answer holds the engine's lock; a probe would wait for it and time out."""
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
