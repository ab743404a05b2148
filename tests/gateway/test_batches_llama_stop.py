"""Batch API lines on llama.cpp's own server (SmolLM2-135M, one slot, greedy): a line is sent as a stream and its
output holds the answer in one piece, the same as the engine answers the request unstreamed; and a line running
on the one slot is stopped for an interactive request, which llama-server then serves at once (the stream's
connection closed: it stops the line at its next token), and the line is answered once, in full."""

from __future__ import annotations

import asyncio
import io
import json
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import openai
import pytest

from tests.conftest import Engine, Gateway, GatewayFactory, create_key, eventually, start_smollm2, worker
from tests.gateway.test_batches import FAST, finished, jsonl, lines_of
from turnout.core.admission import Priority
from turnout.gateway import preemption, proxy
from turnout.gateway.keys import DISPATCHER, FLEET


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    started = start_smollm2("smollm2", tmp_path_factory.mktemp("smollm2-batch") / "server.log")
    yield started
    started.stop()


def direct(engine: Engine, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The engine's own answer in one piece (not through the gateway)."""
    request = urllib.request.Request(engine.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        out: dict[str, Any] = json.loads(answer.read())
    return out


async def llama_gateway(gateway: GatewayFactory, engine: Engine) -> Gateway:
    gw = await gateway([worker("smol", engine.url, type="openai")], auth={"open": False}, batches=FAST)

    async def known() -> bool:
        return gw.app[FLEET].workers["smol"].engine_family == "llamacpp"

    await eventually(known, "the worker to be known as llama.cpp's server", 30)
    return gw


async def run_batch(oa: openai.AsyncOpenAI, url: str, lines: list[dict[str, Any]]) -> Any:
    uploaded = await oa.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    return await oa.batches.create(input_file_id=uploaded.id, endpoint=url, completion_window="24h")  # type: ignore[arg-type]


@asynccontextmanager
async def nightly_and_chat(gw: Gateway) -> AsyncIterator[tuple[openai.AsyncOpenAI, openai.AsyncOpenAI]]:
    """The official SDK on the gateway twice: with a key of class batch (the batch) and one of class interactive."""
    _, nightly = create_key(gw, app="nightly", priority=Priority.BATCH)
    _, chat = create_key(gw, app="chat", priority=Priority.INTERACTIVE)
    async with (
        openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=nightly, max_retries=0) as oa,
        openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=chat, max_retries=0) as person,
    ):
        yield oa, person


CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 24}
COMPLETION = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 12}


@pytest.mark.parametrize(("url", "body"), [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)])
async def test_a_line_sent_as_a_stream_is_answered_as_the_engine_answers_it_unstreamed(
    smollm2: Engine, gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch, url: str, body: dict[str, Any]
) -> None:
    made: list[int] = []
    real = preemption.made_whole

    async def spy(*args: Any) -> bytes:
        made.append(1)
        return await real(*args)

    monkeypatch.setattr(proxy, "made_whole", spy)
    gw = await llama_gateway(gateway, smollm2)
    _, key = create_key(gw, app="nightly", priority=Priority.BATCH)
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0) as oa:
        batch = await run_batch(oa, url, [{"custom_id": "a", "method": "POST", "url": url, "body": body}])
        done = await finished(oa, batch.id, 120)
        assert done.status == "completed", done
        (line,) = await lines_of(oa, done.output_file_id)
    assert made == [1]  # it went as a stream
    got, want = line["response"]["body"], direct(smollm2, url, body)
    if url == "/v1/chat/completions":
        parsed = openai.types.chat.ChatCompletion.model_validate(got)
        assert parsed.object == "chat.completion" and parsed.id.startswith("chatcmpl-")
        assert got["choices"][0]["message"] == want["choices"][0]["message"]
    else:
        parsed_text = openai.types.Completion.model_validate(got)
        assert parsed_text.object == "text_completion"
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert got["choices"][0]["message" if url.endswith("chat/completions") else "text"]
    assert got["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
    for count in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert got["usage"][count] == want["usage"][count]
    assert got["timings"]["predicted_n"] == want["timings"]["predicted_n"]  # llama.cpp's own timings, kept


async def test_a_line_on_the_one_slot_is_stopped_for_an_interactive_request(
    smollm2: Engine, gateway: GatewayFactory
) -> None:
    gw = await llama_gateway(gateway, smollm2)
    dispatcher = gw.app[DISPATCHER]
    long = {**CHAT, "max_tokens": 400, "ignore_eos": True}
    async with nightly_and_chat(gw) as (oa, person):
        url = "/v1/chat/completions"
        batch = await run_batch(oa, url, [{"custom_id": "long", "method": "POST", "url": url, "body": long}])

        async def running() -> bool:
            return bool(dispatcher._stoppable)

        await eventually(running, "the line to run", 30)
        answer = await person.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert answer.choices[0].message.content
        # served before the line, which needs 400 tokens more: without the stop it would have waited for them
        now = await oa.batches.retrieve(batch.id)
        assert now.request_counts is not None and now.request_counts.completed == 0
        done = await finished(oa, batch.id, 180)
        assert done.status == "completed" and done.request_counts is not None
        assert done.request_counts.completed == 1
        (line,) = await lines_of(oa, done.output_file_id)
    body = line["response"]["body"]
    assert body["usage"]["completion_tokens"] == 400 and body["choices"][0]["finish_reason"] == "length"


async def test_a_stopped_line_is_continued_from_what_it_had_answered(
    smollm2: Engine, gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line stopped after it had answered some tokens is sent again as their continuation (a trailing
    assistant message, max_tokens less what it had): the engine answers only the rest, and the output holds the
    whole answer, its usage as one request's (all 200 tokens as completion)."""
    partials: list[preemption.Partial] = []
    real = preemption.joining

    def spy(whole: Any, partial: preemption.Partial) -> Any:
        partials.append(partial)
        return real(whole, partial)

    monkeypatch.setattr(preemption, "joining", spy)
    gw = await llama_gateway(gateway, smollm2)
    dispatcher = gw.app[DISPATCHER]
    long = {**CHAT, "max_tokens": 200, "ignore_eos": True}
    async with nightly_and_chat(gw) as (oa, person):
        url = "/v1/chat/completions"
        batch = await run_batch(oa, url, [{"custom_id": "long", "method": "POST", "url": url, "body": long}])

        async def answering() -> bool:  # the line runs, and its stream has carried a few tokens
            running = [entry[1] for entry in dispatcher._stoppable.values()]
            return bool(running) and (running[0].first_at is not None)

        await eventually(answering, "the line to answer", 30)
        await asyncio.sleep(0.5)
        answer = await person.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert answer.choices[0].message.content
        done = await finished(oa, batch.id, 180)
        assert done.status == "completed" and done.request_counts is not None
        (line,) = await lines_of(oa, done.output_file_id)
    [partial] = partials  # stopped once, continued once
    assert 1 <= partial.tokens < 200
    body = line["response"]["body"]
    content = body["choices"][0]["message"]["content"]
    assert content.startswith(partial.text) and len(content) > len(partial.text)
    assert body["usage"]["completion_tokens"] == 200 and body["choices"][0]["finish_reason"] == "length"
    # the engine answered the rest only: its own count for the continuation
    assert body["timings"]["predicted_n"] == 200 - partial.tokens
    assert body["usage"]["prompt_tokens"] == direct(smollm2, url, {**CHAT, "max_tokens": 1})["usage"]["prompt_tokens"]
