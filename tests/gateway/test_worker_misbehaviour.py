"""Misbehaving workers, end to end through the gateway: every answer is whole and the caller's own, or an
error in the caller's dialect; a stream ends with the model's finish or an error frame on its own line.

The worker is :class:`tests.support.raw_worker.RawWorker`, which sends exactly the bytes a test scripts.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import GatewayFactory, eventually, worker
from tests.support.raw_worker import RawWorker, Reply, http, ndjson, sse
from turnout.errors import UpstreamError
from turnout.gateway.keys import FLEET
from turnout.upstream.client import UpstreamClient

CHAT = {"model": "m:1", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = {
    "id": "c1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
OLLAMA_ANSWER = {"model": "m:1", "message": {"role": "assistant", "content": "hello"}, "done": True, "eval_count": 1}


def delta(text: str, finish: str | None = None) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }


Start = Callable[..., Awaitable[tuple[Any, RawWorker]]]


@pytest.fixture
async def start(gateway: GatewayFactory) -> AsyncIterator[Start]:
    workers: list[RawWorker] = []

    async def make(kind: str = "openai", *replies: Reply, **sections: Any) -> tuple[Any, RawWorker]:
        raw = RawWorker()
        raw.replies.extend(replies)
        workers.append(raw)
        url = await raw.start()
        gw = await gateway([worker("w", url, kind)], **sections)
        return gw, raw

    yield make
    for raw in workers:
        await raw.stop()


async def call(gw: Any, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    async with aiohttp.ClientSession() as s, s.post(gw.url + path, json=body) as r:
        return r.status, r.content_type, await r.read()


def raw_url(raw: RawWorker) -> str:
    assert raw._server is not None
    return f"http://127.0.0.1:{raw._server.sockets[0].getsockname()[1]}"


def error_message(path: str, body: bytes) -> str:
    parsed = orjson.loads(body)
    return str(parsed["error"] if path.startswith("/api") else parsed["error"]["message"])


def sse_events(body: bytes) -> list[bytes]:
    assert body.endswith(b"\n\n"), body[-80:]
    events = body[:-2].split(b"\n\n")
    for event in events:
        assert event.startswith(b"data: ") and b"\n" not in event, event  # whole events only
    return [e[6:] for e in events]


def ndjson_lines(body: bytes) -> list[dict[str, Any]]:
    assert body.endswith(b"\n")
    return [orjson.loads(line) for line in body[:-1].split(b"\n")]  # every line parses: none is half a frame


# -- interim heads and stray bytes through the gateway ---------------------------------------------------
async def test_interim_heads_are_skipped_and_no_answer_reaches_the_next_request(start: Start) -> None:
    forged = http(200, orjson.dumps({**ANSWER, "choices": [{**ANSWER["choices"][0], "message": {"content": "LEAK"}}]}))
    first = Reply(
        [
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
            + http(200, orjson.dumps(ANSWER))
            + forged
        ]
    )
    second = Reply([http(200, orjson.dumps({**ANSWER, "id": "c2"}))])
    gw, raw = await start("openai", first, second)
    status, _, body = await call(gw, "/v1/chat/completions", CHAT)
    assert status == 200 and orjson.loads(body)["id"] == "c1"
    status, _, body = await call(gw, "/v1/chat/completions", CHAT)
    assert status == 200 and orjson.loads(body)["id"] == "c2" and b"LEAK" not in body
    assert raw.connections >= 2  # the connection that carried stray bytes was not reused


# -- non-stream answers that are not what the route promises ---------------------------------------------
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
@pytest.mark.parametrize(
    ("reply", "fragment"),
    [
        (Reply([http(200, b"<html>proxy login</html>", "text/html")]), "not valid JSON"),
        (Reply([http(200, b'{"choices": [{"mess')]), "not valid JSON"),
        (Reply([http(200, b"\x00\x01\xff\xfe")]), "not valid JSON"),
        (Reply([http(200, b"[1, 2]")]), "expected an object"),
        (Reply([http(200, b"")]), "empty body"),
        (Reply([b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"id":'], close=True), "connection closed"),
    ],
)
async def test_a_2xx_that_is_not_json_is_a_502(start: Start, path: str, reply: Reply, fragment: str) -> None:
    gw, _ = await start("openai" if path.startswith("/v1") else "ollama", reply)
    status, ctype, body = await call(gw, path, {**CHAT, "stream": False})
    assert status == 502 and ctype == "application/json"
    assert fragment in error_message(path, body)


@pytest.mark.parametrize(
    "answer",
    [
        {"choices": "nope"},
        {"choices": [{"message": 5}]},
        {"choices": [{"message": {"content": 5, "tool_calls": [{"function": "x"}, 7, {"function": {"name": 3}}]}}]},
        {"choices": [{"message": {"content": "x"}, "finish_reason": 9}], "usage": {"prompt_tokens": "many"}},
        {"data": "x"},
    ],
)
async def test_translation_of_a_malformed_answer_is_a_502_or_sane(start: Start, answer: dict[str, Any]) -> None:
    gw, _ = await start("openai", Reply([http(200, orjson.dumps(answer))]))
    status, _, body = await call(gw, "/api/chat", {**CHAT, "stream": False})
    parsed = orjson.loads(body)
    if status == 200:
        assert parsed["done"] is True and isinstance(parsed["message"]["content"], str)
        assert isinstance(parsed["prompt_eval_count"], int)
    else:
        assert status == 502 and isinstance(parsed["error"], str)


async def test_upstream_4xx_keeps_its_status_and_message_in_the_callers_dialect(start: Start) -> None:
    rejection = {"error": {"message": "response_format json_schema is not supported", "type": "invalid_request_error"}}
    replies = [Reply([http(400, orjson.dumps(rejection))]) for _ in range(3)]  # the schema earns one retry
    gw, _ = await start("openai", *replies)
    status, _, body = await call(gw, "/api/chat", {**CHAT, "stream": False, "format": {"type": "object"}})
    assert status == 400
    assert orjson.loads(body) == {"error": "worker answered HTTP 400: response_format json_schema is not supported"}
    status, _, body = await call(gw, "/v1/chat/completions", CHAT)
    assert status == 400 and orjson.loads(body) == rejection


@pytest.mark.parametrize(("upstream", "expected"), [(500, 502), (503, 503), (302, 502), (422, 422)])
async def test_upstream_error_statuses(start: Start, upstream: int, expected: int) -> None:
    gw, _ = await start("openai", Reply([http(upstream, b"Internal Server Error", "text/plain")]))
    status, _, body = await call(gw, "/v1/chat/completions", CHAT)
    assert status == expected and "Internal Server Error" in error_message("/v1", body)


# -- streams -------------------------------------------------------------------------------------------
FINISHED_SSE = sse(delta("a"), delta("b"), delta("", "stop"), b"[DONE]")


@pytest.mark.parametrize(
    ("stream", "pieces", "ends"),
    [
        (FINISHED_SSE, None, "finish"),
        # the worker closes after two content frames: no finish
        (sse(delta("a"), delta("b")), None, "error"),
        # content that merely contains the terminator and the word error is not an end
        (sse(delta("a"), delta("data: [DONE]"), delta('"error": true')), None, "error"),
        # llama_cpp.server's interrupt: [DONE] with no finish_reason
        (sse(delta("a"), b"[DONE]"), None, "error"),
        # dies in the middle of a line
        (sse(delta("a")) + b'data: {"choices": [{"delta": {"cont', None, "error"),
        # the model's finish without [DONE], then a close: complete
        (sse(delta("a"), delta("", "length")), None, "finish"),
        # split at awkward places
        (FINISHED_SSE, [7, 19, 40, 41, 60], "finish"),
        # a frame that is not JSON
        (sse(delta("a")) + b"data: <html>\n\n", None, "error"),
    ],
)
async def test_openai_streams_end_properly(start: Start, stream: bytes, pieces: list[int] | None, ends: str) -> None:
    cuts = [0, *(pieces or []), len(stream)]
    parts = [stream[a:b] for a, b in itertools.pairwise(cuts)]
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    gw, _ = await start("openai", Reply([head, *parts], close=True, gap_s=0.005))
    status, _, body = await call(gw, "/v1/chat/completions", {**CHAT, "stream": True})
    assert status == 200
    events = sse_events(body)
    if ends == "finish":
        assert events[-1] == b"[DONE]" or orjson.loads(events[-1])["choices"][0]["finish_reason"]
        assert all(b"error" not in e for e in events)
    else:
        last = orjson.loads(events[-1])
        assert "error" in last and isinstance(last["error"]["message"], str), events
        assert b"[DONE]" not in events


@pytest.mark.parametrize(
    ("stream", "ends"),
    [
        (ndjson({"message": {"content": "a"}, "done": False}, {"done": True, "done_reason": "stop"}), "finish"),
        (ndjson({"message": {"content": "a"}, "done": False}), "error"),
        (ndjson({"message": {"content": '"done": true'}, "done": False}), "error"),
        (ndjson({"message": {"content": "a"}, "done": False}) + b'{"message": {"con', "error"),
        (ndjson({"message": {"content": "a"}, "done": False}, {"error": "model crashed"}), "worker-error"),
    ],
)
async def test_ollama_streams_end_properly(start: Start, stream: bytes, ends: str) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\n\r\n"
    gw, _ = await start("ollama", Reply([head, stream], close=True))
    status, _, body = await call(gw, "/api/chat", {**CHAT, "stream": True})
    assert status == 200
    lines = ndjson_lines(body)
    if ends == "finish":
        assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"
    elif ends == "worker-error":
        assert lines[-1] == {"error": "model crashed"}
    else:
        assert set(lines[-1]) == {"error"} and "before the model finished" in lines[-1]["error"]
        assert not any(line.get("done") is True for line in lines)


@pytest.mark.parametrize(
    "stream",
    [
        sse(delta("a"), b"[DONE]"),  # interrupted: no finish_reason
        sse(delta("a")),
        sse(
            {"choices": "x"},
            {"choices": [{"delta": 5}]},
            {"choices": [{"delta": {"tool_calls": [7, {"function": 1}]}}]},
        ),
        sse(delta("a")) + b"data: [1]\n\n",
    ],
)
async def test_translated_streams_never_report_a_false_stop(start: Start, stream: bytes) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    gw, _ = await start("openai", Reply([head, stream], close=True))
    status, _, body = await call(gw, "/api/chat", {**CHAT, "stream": True})
    assert status == 200
    lines = ndjson_lines(body)
    assert set(lines[-1]) == {"error"}, lines
    assert not any(line.get("done") is True for line in lines)


async def test_a_line_past_the_bound_ends_with_an_error_frame(start: Start) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\n\r\n"
    huge = b'{"message": {"content": "' + b"x" * (5 << 20)
    gw, _ = await start("ollama", Reply([head, ndjson({"message": {"content": "a"}, "done": False}), huge], close=True))
    status, _, body = await call(gw, "/api/chat", {**CHAT, "stream": True})
    lines = ndjson_lines(body)
    assert status == 200 and len(body) < 4096 and "longer than" in lines[-1]["error"]


async def test_a_worker_that_ignores_stream_gets_its_json_relayed(start: Start) -> None:
    gw, _ = await start("ollama", Reply([http(200, orjson.dumps(OLLAMA_ANSWER))]))
    status, _, body = await call(gw, "/api/chat", {**CHAT, "stream": True})
    assert status == 200 and orjson.loads(body) == OLLAMA_ANSWER


async def test_a_schema_refused_in_openai_form_is_retried_in_llama_cpp_form_once(start: Start) -> None:
    refusal = Reply([http(422, b'{"detail": [{"msg": "Input should be \'text\' or \'json_object\'"}]}')])
    ok = Reply([http(200, orjson.dumps(ANSWER))])
    gw, raw = await start("openai", refusal, ok, ok)
    body = {**CHAT, "stream": False, "format": {"type": "object"}}
    for _ in range(2):
        status, _, reply = await call(gw, "/api/chat", body)
        assert status == 200 and orjson.loads(reply)["message"]["content"] == "hello"
    sent = [orjson.loads(p)["response_format"] for p in raw.posts]
    assert sent == [
        {"type": "json_schema", "json_schema": {"name": "response", "schema": {"type": "object"}}},
        {"type": "json_object", "schema": {"type": "object"}},
        {"type": "json_object", "schema": {"type": "object"}},  # remembered: no second refusal
    ]


async def test_a_schema_refused_in_both_forms_is_the_workers_4xx(start: Start) -> None:
    refusal = Reply([http(400, b'{"error": {"message": "schemas are not supported"}}')])
    gw, _ = await start("openai", refusal, refusal)
    status, _, reply = await call(gw, "/api/chat", {**CHAT, "stream": False, "format": {"type": "object"}})
    assert status == 400 and "schemas are not supported" in orjson.loads(reply)["error"]


async def test_a_worker_that_keeps_sending_after_the_end_loses_the_connection(start: Start) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"%x\r\n%s\r\n" % (len(FINISHED_SSE), FINISHED_SSE)
    trickle = [b"5\r\njunk\n\r\n"] * 100  # 10 s of bytes after [DONE], never the final chunk
    gw, _ = await start("openai", Reply([head, body, *trickle], gap_s=0.1))
    loop = asyncio.get_running_loop()
    began = loop.time()
    state = gw.app[FLEET].workers["w"]

    async def released() -> bool:
        return state.in_flight == 0

    async with aiohttp.ClientSession() as keep_alive:  # a client that keeps its connection: no cancellation
        async with keep_alive.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            assert r.status == 200 and await r.read() == FINISHED_SSE
        assert loop.time() - began < 3
        await eventually(released, "the request's slot is released", limit_s=3, every_s=0.05)
    assert loop.time() - began < 4


async def test_a_client_leaving_after_a_complete_stream_is_a_success(start: Start) -> None:
    """The answer is complete at the terminal frame: a client that hangs up then (the worker still sending the
    rest of its body) leaves a served request, counted with its tokens, not a failed one refunded."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"%x\r\n%s\r\n" % (len(FINISHED_SSE), FINISHED_SSE)
    trickle = [b"5\r\njunk\n\r\n"] * 10  # a second more of bytes after [DONE]
    gw, _ = await start("openai", Reply([head, body, *trickle], gap_s=0.1))
    # a session closed at once after the answer: its connection goes with it, while the worker still sends
    async with (
        aiohttp.ClientSession() as once,
        once.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r,
    ):
        assert r.status == 200 and await r.read() == FINISHED_SSE

    async def recorded() -> list[dict[str, Any]] | None:
        async with (
            aiohttp.ClientSession(headers=gw.admin_headers) as admin,
            admin.get(f"{gw.url}/admin/api/usage?since=1h") as r,
        ):
            rows: list[dict[str, Any]] = (await r.json())["rows"]
        return rows or None

    (row,) = await eventually(recorded, "the request's usage row", limit_s=5, every_s=0.1)
    assert (row["requests"], row["errors"], row["statuses"]) == (1, 0, {"200": 1})
    assert row["completion_tokens"] == 2  # the stream's two content events (the worker reported no usage)


async def test_an_answer_over_the_size_bound_is_an_error(start: Start) -> None:
    gw, raw = await start("openai", Reply([http(200, b'{"a": "' + b"x" * 5000 + b'"}')]))
    client = UpstreamClient(connect_timeout_s=2, total_timeout_s=5)
    try:
        async with client.request("POST", raw_url(raw) + "/v1/chat/completions", label="w", body=b"{}") as resp:
            with pytest.raises(UpstreamError, match="larger than 1000 bytes"):
                await resp.read(limit=1000)
    finally:
        await client.close()
    del gw
