"""A held stream is not cut: a streamed call held for longer than a second (here its only worker down for a moment,
expected back: turnout.gateway.hold) gets status 200, its stream's headers and keep-alives while it waits, then the
real answer on the same response; a hold that runs out, or a worker that fails once it is back, ends the stream with
the dialect's own error event, which the official SDKs raise (or, for the Responses API, yield as response.failed);
an Ollama stream and a short hold keep today's answers (the 503 with Retry-After, all headers). The real SDKs are the
clients, with read timeouts shorter than the hold; the worker is the Ollama emulator (Ollama cannot run here)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import anthropic
import ollama
import openai
import pytest

from tests.conftest import Clients, EmulatorFactory, Gateway, GatewayFactory, eventually, worker
from tests.gateway.test_server_timing import server_timing
from tests.support.ollama_emulator import OllamaEmulator
from turnout.gateway.keys import DISPATCHER, METRICS, POLLER

MODEL = "m:1"
KEEPALIVE_S = 0.2  # limits.stream_keepalive_s: the headers go out after this (less than held_stream.EARLY_S)
HELD_S = 2.5  # how long the worker stays down while a call is held
READ_TIMEOUT_S = 1.0  # the SDKs' read timeout: shorter than the hold, longer than the keep-alives' interval
MESSAGES = [{"role": "user", "content": "hi"}]


@dataclass(frozen=True)
class Dialect:
    path: str
    body: dict[str, Any]
    keepalive: bytes  # what a held stream of the dialect is sent while it waits
    last: Callable[[list[tuple[str | None, Any]]], bool]  # the complete answer's last event


def _ends(event: str) -> Callable[[list[tuple[str | None, Any]]], bool]:
    return lambda events: (
        events[-1][0] == event or (isinstance(events[-1][1], dict) and events[-1][1].get("type") == event)
    )


SSE = {
    "chat": Dialect(
        "/v1/chat/completions",
        {"model": MODEL, "messages": MESSAGES, "stream": True},
        b": keep-alive\n\n",
        lambda events: events[-1][1] == "[DONE]",
    ),
    "messages": Dialect(
        "/v1/messages",
        {"model": MODEL, "messages": MESSAGES, "max_tokens": 16, "stream": True},
        b'event: ping\ndata: {"type":"ping"}\n\n',
        _ends("message_stop"),
    ),
    "responses": Dialect(
        "/v1/responses",
        {"model": MODEL, "input": "hi", "stream": True},
        b": keep-alive\n\n",
        _ends("response.completed"),
    ),
}


def sse_events(text: str) -> tuple[list[str], list[tuple[str | None, Any]]]:
    """(comment lines, (event, data) of each event) of an event stream, as the WHATWG parser reads it."""
    comments: list[str] = []
    events: list[tuple[str | None, Any]] = []
    for block in text.split("\n\n"):
        event, data = None, []
        for line in block.split("\n"):
            if line.startswith(":"):
                comments.append(line[1:].strip())
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            joined = "\n".join(data)
            events.append((event, joined if joined == "[DONE]" else json.loads(joined)))
    return comments, events


@asynccontextmanager
async def down_for_a_moment(emu: OllamaEmulator, gw: Gateway) -> AsyncIterator[None]:
    """The worker is down (seen so by the gateway, healthy a moment ago) inside the block, and back after it."""
    port = emu.port
    await emu.stop()
    await gw.app[POLLER].poll_all()
    try:
        yield
    finally:
        await emu.start(port)
        await gw.app[POLLER].poll_all()  # seen back: the held call goes on


async def held_gateway(
    emulator: EmulatorFactory, gateway: GatewayFactory, hold_s: float = 30, keepalive_s: float = KEEPALIVE_S
) -> tuple[OllamaEmulator, Gateway]:
    emu = await emulator("a", [MODEL])
    gw = await gateway(
        [worker("a", emu.url)],
        routing={"hold_s": hold_s, "explain_header": True},
        limits={"stream_keepalive_s": keepalive_s},
    )
    return emu, gw


@pytest.mark.parametrize("name", list(SSE))
async def test_a_held_stream_gets_its_headers_and_keepalives_then_its_answer(
    emulator: EmulatorFactory, gateway: GatewayFactory, name: str
) -> None:
    dialect = SSE[name]
    emu, gw = await held_gateway(emulator, gateway)
    async with aiohttp.ClientSession() as http:
        async with down_for_a_moment(emu, gw):
            # the headers come while the worker is still down (before, they came with its answer)
            r = await asyncio.wait_for(http.post(gw.url + dialect.path, json=dialect.body), HELD_S)
            assert r.status == 200 and r.content_type == "text/event-stream", r.headers
            assert "X-Turnout-Route" not in r.headers  # (not routed yet: it comes later, in a comment)
            for _ in range(2):  # keep-alives, one every stream_keepalive_s, while it is held
                assert (
                    await asyncio.wait_for(r.content.readexactly(len(dialect.keepalive)), HELD_S) == dialect.keepalive
                )
            await asyncio.sleep(HELD_S - 2 * KEEPALIVE_S)
        async with r:
            text = (await asyncio.wait_for(r.read(), 30)).decode()
    comments, events = sse_events(text)
    # the answer on the same response, complete, and nothing of an error
    assert events and dialect.last(events), events[-3:]
    assert not any(isinstance(data, dict) and (data.get("error") or data.get("type") == "error") for _, data in events)
    # the headers that could not go out early, in one comment before the answer: where it went, and its whole timing
    late = dict(c.split(": ", 1) for c in comments if ": " in c)
    assert late["X-Turnout-Route"].startswith("a; "), comments
    assert "hold" in server_timing(late["Server-Timing"]), comments
    assert server_timing(late["Server-Timing"])["hold"] >= 1000 * (HELD_S - 0.5)


async def test_sdks_with_a_read_timeout_shorter_than_the_hold_get_their_answer(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """Before, the first byte came once the worker answered: each of these raised its timeout error."""
    emu, gw = await held_gateway(emulator, gateway)
    timeout = openai.Timeout(30, read=READ_TIMEOUT_S)
    async with (
        openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=timeout) as oai,
        anthropic.AsyncAnthropic(base_url=gw.url, api_key="unused", max_retries=0, timeout=timeout) as claude,
    ):
        for ask in ("chat", "responses", "messages"):
            async with down_for_a_moment(emu, gw):
                if ask == "chat":
                    stream: Any = await oai.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
                elif ask == "responses":
                    stream = await oai.responses.create(model=MODEL, input="hi", stream=True)
                else:
                    stream = await claude.messages.create(model=MODEL, max_tokens=16, messages=MESSAGES, stream=True)
                waiting = asyncio.ensure_future(anext(aiter(stream)))
                await asyncio.sleep(HELD_S)  # held: the keep-alives keep the read timeout from running out
                assert not waiting.done() or waiting.exception() is None, waiting.exception()
            first = await waiting
            kinds = [getattr(first, "type", "chunk")] + [getattr(e, "type", "chunk") async for e in stream]
            finish = {"chat": "chunk", "responses": "response.completed", "messages": "message_stop"}[ask]
            assert kinds[-1] == finish, (ask, kinds)


async def test_a_held_stream_whose_hold_runs_out_ends_with_its_dialects_error_event(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """The 503 it would have had cannot go out after the headers: the SDKs raise the dialect's error event instead
    (the Responses SDK yields response.failed), with what the 503 said and its Retry-After in words."""
    emu, gw = await held_gateway(emulator, gateway, hold_s=HELD_S)
    timeout = openai.Timeout(30, read=READ_TIMEOUT_S)
    async with (
        down_for_a_moment(emu, gw),
        openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=timeout) as oai,
        anthropic.AsyncAnthropic(base_url=gw.url, api_key="unused", max_retries=0, timeout=timeout) as claude,
    ):
        chat = await oai.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        assert chat.response.status_code == 200  # the headers went out early
        with pytest.raises(openai.APIError) as raised:
            async for _ in chat:
                pass
        assert isinstance(raised.value.body, dict) and raised.value.body["code"] == "no_healthy_worker"
        assert "try again in" in raised.value.message and MODEL in raised.value.message, raised.value.message

        messages = await claude.messages.create(model=MODEL, max_tokens=16, messages=MESSAGES, stream=True)
        with pytest.raises(anthropic.APIStatusError) as failed:
            async for _ in messages:
                pass
        body = failed.value.body
        assert isinstance(body, dict) and body["error"]["type"] == "overloaded_error", body
        assert "try again in" in body["error"]["message"] and body["request_id"], body

        responses = await oai.responses.create(model=MODEL, input="hi", stream=True)
        events = [event async for event in responses]
        assert [e.type for e in events] == ["response.failed"], events
        error = events[0].response.error
        assert error is not None and "try again in" in error.message and MODEL in error.message, error


async def test_an_ollama_stream_gets_nothing_early_and_keeps_its_503(
    emulator: EmulatorFactory, gateway: GatewayFactory, clients: Clients
) -> None:
    """NDJSON has no line Ollama's clients skip: a held Ollama stream is answered as before, its 503 with
    Retry-After when the hold runs out (however long past the keep-alive interval), which ollama-python raises."""
    emu, gw = await held_gateway(emulator, gateway, hold_s=1.5)
    async with down_for_a_moment(emu, gw):
        client = clients.ollama(gw.url)
        with pytest.raises(ollama.ResponseError) as raised:
            async for _ in await client.chat(model=MODEL, messages=MESSAGES, stream=True):
                pass
        assert raised.value.status_code == 503 and MODEL in raised.value.error, raised.value
        async with aiohttp.ClientSession() as http:
            body = {"model": MODEL, "messages": MESSAGES}  # (streamed: Ollama's default)
            async with http.post(f"{gw.url}/api/chat", json=body) as r:
                assert r.status == 503 and r.headers["Retry-After"], r.headers
                assert (await r.json())["error"]


async def test_a_short_hold_sends_nothing_early(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    """A hold shorter than a second keeps a stream's answers as they were: a 503 with Retry-After when it runs out,
    and every header, X-Turnout-Route and the whole Server-Timing with the hold, when the worker is back in time."""
    emu, gw = await held_gateway(emulator, gateway, keepalive_s=10)
    chat = SSE["chat"]
    async with aiohttp.ClientSession() as http:
        async with down_for_a_moment(emu, gw):
            hold = {"X-Turnout-Hold": "0.3"}
            async with http.post(gw.url + chat.path, json=chat.body, headers=hold) as r:
                assert r.status == 503 and r.headers["Retry-After"], r.status
                assert (await r.json())["error"]["code"] == "no_healthy_worker"
            asked = asyncio.ensure_future(http.post(gw.url + chat.path, json=chat.body))
            await asyncio.sleep(0.2)
            assert not asked.done()
        async with await asked as r:
            assert r.status == 200 and r.headers["X-Turnout-Route"].startswith("a; ")
            assert "hold" in server_timing(r.headers["Server-Timing"])
            comments, events = sse_events((await r.read()).decode())
    assert comments == [] and chat.last(events), (comments, events[-2:])


async def test_a_worker_that_fails_once_back_ends_the_held_stream_with_an_error_event(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """The worker comes back and answers 500: the client's stream, whose headers went out, ends with the error (the
    OpenAI SDK raises it; an Anthropic stream's last event is its error event)."""
    emu, gw = await held_gateway(emulator, gateway)
    emu.behaviour.model_faults = {MODEL: "http_500"}
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0) as oai:
        async with down_for_a_moment(emu, gw):
            chat = await oai.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        with pytest.raises(openai.APIError) as raised:
            async for _ in chat:
                pass
        assert "HTTP 500" in raised.value.message, raised.value.message
    messages = SSE["messages"]
    async with aiohttp.ClientSession() as http:
        async with down_for_a_moment(emu, gw):
            r = await asyncio.wait_for(http.post(gw.url + messages.path, json=messages.body), HELD_S)
            assert r.status == 200
        async with r:
            _, events = sse_events((await r.read()).decode())
    event, data = events[-1]
    assert event == "error" and data["error"]["type"] == "api_error" and "HTTP 500" in data["error"]["message"], data


async def test_a_client_that_leaves_while_held_gives_its_place_back(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """A client that closes its connection after the early headers, while held, ends the call: its place in the
    queue and its count as held are given back, and no keep-alive goes on."""
    emu, gw = await held_gateway(emulator, gateway)
    dispatcher, metrics = gw.app[DISPATCHER], gw.app[METRICS]
    chat = SSE["chat"]
    async with down_for_a_moment(emu, gw):
        async with aiohttp.ClientSession() as http:
            r = await asyncio.wait_for(http.post(gw.url + chat.path, json=chat.body), HELD_S)
            assert r.status == 200 and await r.content.readexactly(len(chat.keepalive)) == chat.keepalive
            assert dispatcher.waiting == 1 and metrics.requests_held == 1
            r.close()

        async def given_back() -> bool:
            return dispatcher.waiting == 0 and metrics.requests_held == 0

        await eventually(given_back, "the held call's place given back", limit_s=10, every_s=0.05)
    held = [t for t in asyncio.all_tasks() if t.get_name() == "held-stream"]
    assert not held or all(t.done() for t in held), held
