"""Property-based fuzzing of the Messages routes through a whole gateway (as tests/gateway/test_fuzz.py does for
the OpenAI and Ollama routes): hostile clients, and workers of each kind answering anything.

* Client requests on /v1/messages and /v1/messages/count_tokens: never a 500, and every error in Anthropic's
  shape ({"type": "error", "error": {"type", "message"}}).
* Worker answers (an OpenAI-style worker and an Ollama worker, both translated, and a worker that serves the
  Messages API itself, passed through): arbitrary statuses, bodies, frames and framings. The client never sees a
  500; a 2xx non-stream answer is a JSON object; a stream is made of whole SSE events and ends with
  message_stop or an error event.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.gateway.test_fuzz import ANSWER, FUZZ, WORKER_FUZZ, json_values, raw_bodies, start_workers, worker_replies
from tests.support.raw_worker import RawWorker, Reply, http
from tests.support.threaded_gateway import Client, threaded_gateway

ROUTES = ["/v1/messages", "/v1/messages?beta=true", "/v1/messages/count_tokens"]
MODELS = ["m:1", "o:1", "ghost:1", "", "x" * 300, "m\x00"]

blocks = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image", "tool_use", "tool_result", "thinking", "document"]) | json_values},
    optional={
        "text": json_values,
        "source": json_values,
        "id": json_values,
        "name": json_values,
        "input": json_values,
        "tool_use_id": json_values,
        "content": json_values,
    },
)
client_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(MODELS) | json_values,
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "assistant", "system"]) | json_values},
                optional={"content": st.text(max_size=10) | st.lists(blocks, max_size=3) | json_values},
            )
            | json_values,
            max_size=3,
        )
        | json_values,
        "system": json_values,
        "tools": json_values,
        "tool_choice": json_values,
        "max_tokens": st.integers(-(2**40), 2**40) | json_values,
        "stream": st.booleans() | json_values,
        "thinking": json_values,
        "stop_sequences": json_values,
        "temperature": json_values,
        "metadata": json_values,
    },
)


def assert_anthropic_error(status: int, ctype: str, body: bytes) -> None:
    assert ctype == "application/json", (status, ctype, body[:200])
    parsed = orjson.loads(body)
    assert parsed["type"] == "error" and isinstance(parsed["error"]["message"], str), parsed
    assert parsed["error"]["type"] in (
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "api_error",
        "overloaded_error",
        "timeout_error",
    ), parsed


@pytest.fixture
def client_gateway() -> Iterator[Client]:
    with tempfile.TemporaryDirectory() as tmp, threaded_gateway(Path(tmp), start_workers()) as (_, client):
        yield client


@FUZZ
@given(path=st.sampled_from(ROUTES), body=client_bodies)
def test_client_json_never_gets_a_500(client_gateway: Client, path: str, body: dict[str, Any]) -> None:
    status, ctype, data = client_gateway.post(path, json.dumps(body).encode())
    assert status < 500 or status in (502, 503), (path, body, status, data[:300])
    if status >= 400:
        assert_anthropic_error(status, ctype, data)


@FUZZ
@given(path=st.sampled_from(ROUTES), body=raw_bodies)
def test_client_bytes_never_get_a_500(client_gateway: Client, path: str, body: bytes) -> None:
    status, ctype, data = client_gateway.post(path, body)
    assert status < 500, (path, body[:80], status, data[:300])
    if status >= 400:
        assert_anthropic_error(status, ctype, data)


# -- worker answers ---------------------------------------------------------------------------------------------
anthropic_events = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
                "ping",
                "error",
            ]
        )
        | json_values
    },
    optional={
        "message": json_values,
        "index": json_values,
        "delta": st.fixed_dictionaries({}, optional={"stop_reason": st.sampled_from([None, "end_turn"])}) | json_values,
        "usage": json_values,
        "error": json_values,
    },
)
junk = st.sampled_from([b"not json", b"[1]", b"\xff", b"", b'{"a":'])


@st.composite
def native_replies(draw: st.DrawFn) -> Reply:
    status = draw(st.sampled_from([200, 200, 200, 400, 404, 500, 503]))
    if draw(st.booleans()):
        body = json.dumps(draw(json_values)).encode()  # json: big integers too
        ctype = "application/json"
    else:
        parts = []
        for event in draw(st.lists(anthropic_events | junk, max_size=6)):
            data = event if isinstance(event, bytes) else json.dumps(event).encode()
            name = event.get("type") if isinstance(event, dict) else None
            line = b"event: " + str(name).encode() + b"\n" if isinstance(name, str) and draw(st.booleans()) else b""
            parts.append(line + b"data: " + data + b"\n\n")
        body = b"".join(parts)
        if draw(st.booleans()):
            body = body[: draw(st.integers(0, len(body)))]
        ctype = "text/event-stream"
    head = b"HTTP/1.1 %d X\r\nContent-Type: %s\r\n" % (status, ctype.encode())
    if draw(st.booleans()):
        return Reply([head + b"Content-Length: %d\r\n\r\n" % len(body) + body])
    return Reply([head + b"Connection: close\r\n\r\n" + body], close=True)


def assert_well_formed(stream: bool, status: int, ctype: str, data: bytes) -> None:
    assert status != 500, (status, data[:300])
    if status >= 300:
        assert_anthropic_error(status, ctype, data)
        return
    if ctype == "application/json":
        assert isinstance(orjson.loads(data), dict)
        return
    assert stream and ctype == "text/event-stream", (ctype, data[:200])
    assert data.endswith(b"\n\n"), data[-200:]
    last = None
    for event in data.split(b"\n\n")[:-1]:
        lines = event.split(b"\n")
        payload = [line[5:].strip() for line in lines if line.startswith(b"data:")]
        if payload:
            last = orjson.loads(payload[0])
            assert isinstance(last, dict), event
    assert last is not None and last.get("type") in ("message_stop", "error"), data[-300:]


@pytest.fixture(scope="module")
def worker_gateway() -> Iterator[tuple[Client, dict[str, RawWorker]]]:
    raws: dict[str, RawWorker] = {}

    async def start() -> tuple[list[dict[str, Any]], Any]:
        entries = []
        for name, kind, model, native in (
            ("oa", "openai", "o:1", []),
            ("ol", "ollama", "l:1", []),
            ("na", "openai", "n:1", ["anthropic"]),
        ):
            raw = RawWorker(models=[model])
            raws[name] = raw
            entries.append({"name": name, "url": await raw.start(), "type": kind, "native_apis": native})

        async def stop() -> None:
            for raw in raws.values():
                await raw.stop()

        return entries, stop

    # polls never take a worker out; failed answers take a model out after 100 in a row, which each example's valid
    # answer first (answered_once) never lets happen, so every example reaches its worker
    health = {"interval_s": 3600, "timeout_s": 2, "failures_to_down": 100, "request_failures_to_down": 100}
    with (
        tempfile.TemporaryDirectory() as tmp,
        threaded_gateway(Path(tmp), start, health=health) as (_, client),  # type: ignore[arg-type]
    ):
        yield client, raws


# A valid answer from each worker, in its own API (the Messages route reaches "ol" on Ollama's /api/chat).
VALID = {
    "oa": ANSWER,  # test_fuzz.py's, the OpenAI-style worker's answer there too
    "ol": {
        "model": "l:1",
        "message": {"role": "assistant", "content": "ok"},
        "done": True,
        "done_reason": "stop",
        "prompt_eval_count": 1,
        "eval_count": 1,
    },
    "na": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "n:1",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    },
}


def answered_once(client: Client, name: str, target: RawWorker) -> None:
    """One valid answer from the worker before the fuzzed one: a failure streak of
    ``health.request_failures_to_down`` (100 at most) would take the model out on its worker, and the next examples
    would not reach it (the native worker's random answers fail in nearly every example)."""
    target.default = Reply([http(200, orjson.dumps(VALID[name]))])
    body = {"model": target.models[0], "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    status, _, payload = client.post("/v1/messages", orjson.dumps(body))
    assert status == 200, (name, status, payload[:300])


@WORKER_FUZZ
@given(data=st.data())
def test_worker_answers_never_reach_the_client_malformed(
    worker_gateway: tuple[Client, dict[str, RawWorker]], data: st.DataObject
) -> None:
    client, raws = worker_gateway
    name = data.draw(st.sampled_from(["oa", "ol", "na"]))
    target = raws[name]
    answered_once(client, name, target)
    target.default = data.draw(native_replies() if name == "na" else worker_replies(name == "ol"))
    stream = data.draw(st.booleans())
    body = {
        "model": target.models[0],
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "x"}],
        "stream": stream,
    }
    posted = len(target.posts)
    status, ctype, payload = client.post("/v1/messages", orjson.dumps(body))
    assert_well_formed(stream, status, ctype, payload)
    assert len(target.posts) == posted + 1, (status, payload[:200])  # the worker was asked
