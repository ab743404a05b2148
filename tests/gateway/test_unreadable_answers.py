"""A worker answer whose message cannot be read is an error in the client's dialect, never an empty success (issue
32, item 9): every translated direction (Ollama, Anthropic Messages and Responses clients, on an OpenAI-style
worker and on an Ollama worker), whole answers (502) and streams (the stream's error frame, never the model's
finish). The worker is :class:`tests.support.raw_worker.RawWorker`, which sends exactly the bytes a test scripts.
The rules are :mod:`turnout.dialects.readable`'s.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import GatewayFactory, worker
from tests.support.raw_worker import RawWorker, Reply, http, ndjson, sse

MODEL = "m:1"
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
NDJSON_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\n\r\n"
# What each client sends: the route and a body (streamed or not)
CLIENTS: dict[str, tuple[str, dict[str, Any]]] = {
    "ollama-chat": ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
    "ollama-generate": ("/api/generate", {"model": MODEL, "prompt": "hi"}),
    "anthropic": (
        "/v1/messages",
        {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    ),
    "responses": ("/v1/responses", {"model": MODEL, "input": "hi"}),
}


def choice(**fields: Any) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion", "choices": [{"index": 0, **fields}]}


# Whole chat answers whose message cannot be read (an OpenAI-style worker, or Ollama's /v1)
UNREADABLE_ANSWERS = {
    "message-a-string": choice(message="Paris is the capital.", finish_reason="stop"),
    "a-stream-chunk": choice(delta={"role": "assistant", "content": "Paris is the capital."}, finish_reason="stop"),
    "no-message": choice(text="Paris is the capital.", finish_reason="stop"),
    "message-says-nothing": choice(message={"role": "assistant"}, finish_reason="stop"),
    "content-a-number": choice(message={"role": "assistant", "content": 42}, finish_reason="stop"),
}
# Streams of chat chunks whose message cannot be read
UNREADABLE_STREAMS = {
    "chunks-without-delta": [
        choice(message={"role": "assistant", "content": "Paris"}),
        choice(message={"content": " is the capital."}, finish_reason="stop"),
        b"[DONE]",
    ],
    "chunks-with-text": [choice(text="Paris"), choice(text=" is the capital.", finish_reason="stop"), b"[DONE]"],
    "choices-not-a-list": [{"choices": {"0": {"delta": {"content": "Paris"}}}}, choice(delta={}, finish_reason="stop")],
    "delta-a-string": [choice(delta="Paris"), choice(delta={}, finish_reason="stop"), b"[DONE]"],
}

Start = Callable[..., Awaitable[tuple[Any, RawWorker]]]


@pytest.fixture
async def start(gateway: GatewayFactory) -> AsyncIterator[Start]:
    workers: list[RawWorker] = []

    async def make(kind: str, *replies: Reply) -> tuple[Any, RawWorker]:
        raw = RawWorker(models=[MODEL])
        raw.replies.extend(replies)
        workers.append(raw)
        gw = await gateway([worker("w", await raw.start(), kind)])
        return gw, raw

    yield make
    for raw in workers:
        await raw.stop()


async def post(gw: Any, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    headers = {"anthropic-version": "2023-06-01"} if path.startswith("/v1/messages") else {}
    async with aiohttp.ClientSession() as s, s.post(gw.url + path, json=body, headers=headers) as r:
        return r.status, r.content_type, await r.read()


def error_message(client: str, body: bytes) -> str:
    """The message of an error answer, read in the client's dialect (a KeyError when it is not one)."""
    parsed = orjson.loads(body)
    if client.startswith("ollama"):
        return str(parsed["error"])
    if client == "anthropic":
        assert parsed["type"] == "error"
    return str(parsed["error"]["message"])


def last_frame(client: str, body: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the stream's last frame, all its frames) in the client's framing."""
    if client.startswith("ollama"):
        frames = [orjson.loads(line) for line in body.splitlines() if line]
    else:
        frames = []
        for event in body.split(b"\n\n"):
            data = [line[6:] for line in event.split(b"\n") if line.startswith(b"data: ")]
            if data:
                frames.append(orjson.loads(data[0]))
    return frames[-1], frames


def assert_stream_failed(client: str, body: bytes, fragment: str) -> None:
    last, frames = last_frame(client, body)
    if client.startswith("ollama"):
        assert set(last) == {"error"} and fragment in last["error"], frames
        assert not any(f.get("done") is True for f in frames)
    elif client == "anthropic":
        assert last["type"] == "error" and fragment in last["error"]["message"], frames
        assert not any(f.get("type") in ("message_delta", "message_stop") for f in frames)
    else:
        assert last["type"] == "response.failed" and fragment in last["response"]["error"]["message"], frames
        assert not any(f.get("type") in ("response.completed", "response.incomplete") for f in frames)
        assert [f["sequence_number"] for f in frames] == list(range(len(frames)))


# (worker kind, client) pairs whose call reaches the worker as a chat/completions request: every client on an
# OpenAI-style worker, and a Responses client on an Ollama worker (through Ollama's own /v1 routes)
CHAT_WORKERS = [*(("openai", client) for client in CLIENTS), ("ollama", "responses")]


@pytest.mark.parametrize(("kind", "client"), CHAT_WORKERS)
@pytest.mark.parametrize("name", list(UNREADABLE_ANSWERS))
async def test_a_whole_answer_without_a_readable_message_is_a_502(
    start: Start, kind: str, client: str, name: str
) -> None:
    path, body = CLIENTS[client]
    gw, _ = await start(kind, Reply([http(200, orjson.dumps(UNREADABLE_ANSWERS[name]))]))
    status, ctype, reply = await post(gw, path, {**body, "stream": False})
    assert status == 502 and ctype == "application/json", reply
    assert "unexpected shape" in error_message(client, reply)


@pytest.mark.parametrize(("kind", "client"), CHAT_WORKERS)
@pytest.mark.parametrize("name", list(UNREADABLE_STREAMS))
async def test_a_stream_without_a_readable_message_ends_with_an_error_frame(
    start: Start, kind: str, client: str, name: str
) -> None:
    path, body = CLIENTS[client]
    gw, _ = await start(kind, Reply([SSE_HEAD, sse(*UNREADABLE_STREAMS[name])], close=True))
    status, _, reply = await post(gw, path, {**body, "stream": True})
    assert status == 200
    assert_stream_failed(client, reply, "unexpected shape")


@pytest.mark.parametrize("client", list(CLIENTS))
async def test_a_stream_chunk_shape_in_a_whole_answer_is_a_502_for_a_streamed_call(start: Start, client: str) -> None:
    """A worker that ignores ``stream`` and answers one JSON document, a chunk's shape at that."""
    path, body = CLIENTS[client]
    gw, _ = await start("openai", Reply([http(200, orjson.dumps(UNREADABLE_ANSWERS["a-stream-chunk"]))]))
    status, _, reply = await post(gw, path, {**body, "stream": True})
    assert status == 502 and "stream chunk" in error_message(client, reply)


@pytest.mark.parametrize(
    "answer",
    [
        {"model": MODEL, "response": "Paris is the capital.", "done": True},  # a generate's shape
        {"model": MODEL, "message": "Paris is the capital.", "done": True},
        {"model": MODEL, "message": {"role": "assistant", "content": ["Paris"]}, "done": True},
    ],
)
async def test_an_ollama_answer_without_a_readable_message_is_a_502_for_an_anthropic_client(
    start: Start, answer: dict[str, Any]
) -> None:
    path, body = CLIENTS["anthropic"]
    gw, _ = await start("ollama", Reply([http(200, orjson.dumps(answer))]))
    status, _, reply = await post(gw, path, {**body, "stream": False})
    assert status == 502 and "unexpected shape" in error_message("anthropic", reply)


async def test_an_ollama_stream_without_messages_ends_with_an_error_event(start: Start) -> None:
    path, body = CLIENTS["anthropic"]
    stream = ndjson(
        {"model": MODEL, "response": "Paris", "done": False},
        {"model": MODEL, "response": "", "done": True, "done_reason": "stop"},
    )
    gw, _ = await start("ollama", Reply([NDJSON_HEAD, stream], close=True))
    status, _, reply = await post(gw, path, {**body, "stream": True})
    assert status == 200
    assert_stream_failed("anthropic", reply, "unexpected shape")


async def test_a_raw_generate_reads_a_completion_and_nothing_else(start: Start) -> None:
    """A raw generate goes to /v1/completions, whose choices carry ``text``: a chat answer there is unreadable, and
    so is a stream of chat chunks."""
    body = {"model": MODEL, "prompt": "hi", "raw": True}
    whole = Reply([http(200, orjson.dumps(choice(message={"content": "Paris"}, finish_reason="stop")))])
    chunks = Reply([SSE_HEAD, sse(choice(delta={"content": "Paris"}), choice(delta={}, finish_reason="stop"))], True)
    good = Reply([http(200, orjson.dumps(choice(text="Paris", finish_reason="stop")))])
    gw, raw = await start("openai", whole, chunks, good)
    status, _, reply = await post(gw, "/api/generate", {**body, "stream": False})
    assert status == 502 and "choices[0].text is null" in error_message("ollama", reply)
    status, _, reply = await post(gw, "/api/generate", {**body, "stream": True})
    assert status == 200
    assert_stream_failed("ollama-generate", reply, "completion stream chunk's text")
    status, _, reply = await post(gw, "/api/generate", {**body, "stream": False})
    assert status == 200 and orjson.loads(reply)["response"] == "Paris"
    assert [orjson.loads(p)["prompt"] for p in raw.posts] == ["hi"] * 3  # each went to /v1/completions


@pytest.mark.parametrize("client", list(CLIENTS))
async def test_a_readable_empty_answer_is_an_answer(start: Start, client: str) -> None:
    """Only the shape is judged: a model that stopped at once gives an empty answer, not an error; and a message
    whose content is a list of text parts is read."""
    path, body = CLIENTS[client]
    empty = choice(message={"role": "assistant", "content": ""}, finish_reason="stop")
    parts = choice(message={"role": "assistant", "content": [{"type": "text", "text": "Paris"}]}, finish_reason="stop")
    gw, _ = await start("openai", Reply([http(200, orjson.dumps(empty))]), Reply([http(200, orjson.dumps(parts))]))
    status, _, reply = await post(gw, path, {**body, "stream": False})
    assert status == 200, reply
    status, _, reply = await post(gw, path, {**body, "stream": False})
    assert status == 200 and b"Paris" in reply, reply
