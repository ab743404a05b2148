"""Property-based fuzzing of the whole gateway with Hypothesis: hostile clients and misbehaving workers.

* Client requests: arbitrary JSON (and non-JSON) bodies on every inference route, with hostile model
  names, token counts and nesting. The gateway never answers 500, and every error is a JSON error in
  the route's own dialect (OpenAI on ``/v1``, Ollama on ``/api``).
* Worker responses: arbitrary statuses, content types, bodies, stream frames and framings (interim heads,
  short and long bodies, early closes). The client never sees a 500; a 2xx non-stream answer is a JSON
  object; a stream is made of whole frames and ends with the model's finish or an error frame.

One gateway runs for each test on a background loop (tests/support/threaded_gateway.py); requests are
sequential, bounded in number (``max_examples``) and each bounded in time.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.ollama_emulator import Behaviour, OllamaEmulator
from tests.support.raw_worker import RawWorker, Reply, http
from tests.support.threaded_gateway import Client, Started, threaded_gateway

ROUTES = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/api/chat",
    "/api/generate",
    "/api/embed",
    "/api/embeddings",
    "/api/show",
]
MODELS = ["m:1", "o:1", "m", "ghost:1", "", " ", "m:1\r\nX-A: b", "m\x00", "w/o:1", "x" * 300, "ünï:cödé"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
big_ints = st.integers(min_value=-(2**70), max_value=2**70)
client_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(MODELS) | json_values,
        "name": st.sampled_from(MODELS),
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "assistant", "tool", "system"]) | json_values},
                optional={
                    "content": st.text(max_size=20) | json_values,
                    "tool_calls": json_values,
                    "images": json_values,
                },
            )
            | json_values,
            max_size=3,
        )
        | json_values,
        "prompt": st.text(max_size=20) | json_values,
        "input": st.text(max_size=20) | st.lists(st.text(max_size=5), max_size=3) | json_values,
        "stream": st.booleans() | json_values,
        "max_tokens": big_ints | json_values,
        "options": st.fixed_dictionaries({}, optional={"num_predict": big_ints, "temperature": json_values})
        | json_values,
        "format": st.sampled_from(["json", ""]) | json_values,
        "tools": json_values,
        "raw": json_values,
        "stream_options": json_values,
    },
)


def deep(depth: int) -> bytes:
    return b'{"model": "m:1", "x": ' + b"[" * depth + b"]" * depth + b"}"


raw_bodies = st.sampled_from(
    [b"", b"{", b"null", b"[]", b'"x"', b"\xff\xfe", deep(63), deep(65), deep(2000), b'{"model": "m:1"}' * 2]
)


def start_workers() -> Started:
    async def start() -> tuple[list[dict[str, Any]], Any]:
        ollama = OllamaEmulator("a", Behaviour(models=["m:1", "m:latest"], tokens=2))
        await ollama.start()
        raw = RawWorker(models=["o:1"])
        raw.default = Reply([http(200, orjson.dumps(ANSWER))])
        raw_url = await raw.start()

        async def stop() -> None:
            await ollama.stop()
            await raw.stop()

        workers = [
            {"name": "a", "url": ollama.url, "type": "ollama"},
            {"name": "b", "url": raw_url, "type": "openai"},
        ]
        return workers, stop

    return start  # type: ignore[return-value]


ANSWER = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1},
    "data": [{"index": 0, "embedding": [0.1, 0.2]}],
}


def assert_dialect_error(path: str, status: int, ctype: str, body: bytes) -> None:
    assert ctype == "application/json", (status, ctype, body[:200])
    parsed = orjson.loads(body)
    if path.startswith("/api"):
        assert isinstance(parsed.get("error"), str), parsed
    else:
        assert isinstance(parsed.get("error"), dict) and isinstance(parsed["error"].get("message"), str), parsed


@pytest.fixture
def client_gateway() -> Iterator[Client]:
    # One gateway per test: a model the first test's hostile bodies made fail five times in a row is out on its
    # worker for health.model_retry_s (by design), which would otherwise answer the next test's requests with 503.
    with tempfile.TemporaryDirectory() as tmp, threaded_gateway(Path(tmp), start_workers()) as (_, client):
        yield client


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
WORKER_FUZZ = settings(FUZZ, max_examples=400)


@FUZZ
@given(path=st.sampled_from(ROUTES), body=client_bodies)
def test_client_json_never_gets_a_500(client_gateway: Client, path: str, body: dict[str, Any]) -> None:
    status, ctype, data = client_gateway.post(path, json.dumps(body).encode())
    assert status < 500 or status in (502, 503), (path, body, status, data[:300])
    if status >= 400:
        assert_dialect_error(path, status, ctype, data)


@FUZZ
@given(path=st.sampled_from(ROUTES), body=raw_bodies)
def test_client_bytes_never_get_a_500(client_gateway: Client, path: str, body: bytes) -> None:
    status, ctype, data = client_gateway.post(path, body)
    assert status < 500, (path, body[:80], status, data[:300])
    if status >= 400:
        assert_dialect_error(path, status, ctype, data)


# -- worker responses ----------------------------------------------------------------------------------
def frame(value: Any) -> bytes:
    return value if isinstance(value, bytes) else json.dumps(value).encode()


choice = st.fixed_dictionaries(
    {},
    optional={
        "index": st.integers(0, 2) | json_values,
        "delta": st.fixed_dictionaries(
            {}, optional={"content": st.text(max_size=8) | json_values, "tool_calls": json_values}
        )
        | json_values,
        "message": json_values,
        "finish_reason": st.sampled_from([None, "stop", "length", "tool_calls"]) | json_values,
        "text": json_values,
    },
)
openai_frames = st.fixed_dictionaries(
    {}, optional={"choices": st.lists(choice, max_size=2) | json_values, "usage": json_values, "error": json_values}
)
ollama_frames = st.fixed_dictionaries(
    {},
    optional={
        "message": json_values,
        "response": json_values,
        "done": st.booleans() | json_values,
        "error": json_values,
        "eval_count": big_ints | json_values,
        "prompt_eval_count": json_values,
    },
)
junk = st.sampled_from([b"[DONE]", b"not json", b"[1]", b"\xff", b"", b"data: x", b'{"a":'])


@st.composite
def worker_replies(draw: st.DrawFn, ollama: bool) -> Reply:
    status = draw(st.sampled_from([200, 200, 200, 201, 400, 404, 422, 500, 503, 302]))
    kind = draw(st.sampled_from(["json", "sse", "ndjson", "bytes"]))
    if kind == "json":
        body = frame(draw((ollama_frames if ollama else openai_frames) | json_values))
        ctype = "application/json"
    elif kind == "bytes":
        body = draw(st.binary(max_size=200))
        ctype = draw(st.sampled_from(["text/html", "application/json", "application/octet-stream"]))
    else:
        frames = draw(st.lists((ollama_frames if kind == "ndjson" else openai_frames) | junk, max_size=6))
        if kind == "sse":
            body = b"".join(b"data: " + frame(f) + b"\n\n" for f in frames)
            ctype = "text/event-stream"
        else:
            body = b"".join(frame(f) + b"\n" for f in frames)
            ctype = "application/x-ndjson"
        if draw(st.booleans()):
            body = body[: draw(st.integers(0, len(body)))]  # dies anywhere, mid-line included
    interim = b"HTTP/1.1 100 Continue\r\n\r\n" if draw(st.booleans()) else b""
    framing = draw(st.sampled_from(["length", "chunked", "close", "short"]))
    head = b"HTTP/1.1 %d X\r\nContent-Type: %s\r\n" % (status, ctype.encode())
    if framing == "length":
        return Reply([interim + head + b"Content-Length: %d\r\n\r\n" % len(body) + body])
    if framing == "chunked":
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:10], body[10:]) if p)
        return Reply([interim + head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"])
    if framing == "close":
        return Reply([interim + head + b"Connection: close\r\n\r\n" + body], close=True)
    return Reply([interim + head + b"Content-Length: %d\r\n\r\n" % (len(body) + 10) + body], close=True)


def assert_well_formed(path: str, stream: bool, status: int, ctype: str, data: bytes) -> None:
    assert status != 500, (status, data[:300])
    if status >= 300:
        assert_dialect_error(path, status, ctype, data)
        return
    if ctype == "application/json":
        assert isinstance(orjson.loads(data), dict)
        return
    assert stream, (ctype, data[:200])
    if path.startswith("/api"):
        lines = [orjson.loads(line) for line in data.split(b"\n") if line]  # every line a whole object
        assert all(isinstance(line, dict) for line in lines)
        last = lines[-1]
        assert last.get("done") is True or isinstance(last.get("error"), str), lines
        assert not any(line.get("done") is True for line in lines[:-1])
    else:
        assert data.endswith(b"\n\n"), data[-100:]
        events = [e for e in data.split(b"\n\n") if e]
        for event in events:
            assert event.startswith(b"data: "), event
        payloads = [e[6:] for e in events]
        if payloads[-1] == b"[DONE]":
            assert len(payloads) >= 2 and b"[DONE]" not in payloads[:-1]
        else:
            last = orjson.loads(payloads[-1])
            finished = any(isinstance(c, dict) and c.get("finish_reason") for c in last.get("choices") or [])
            assert isinstance(last.get("error"), dict) or finished, payloads


@pytest.fixture(scope="module")
def worker_gateway() -> Iterator[tuple[Client, RawWorker, RawWorker]]:
    raws: dict[str, RawWorker] = {}

    async def start() -> tuple[list[dict[str, Any]], Any]:
        entries = []
        for name, kind, model in (("oa", "openai", "o:1"), ("ol", "ollama", "l:1")):
            raw = RawWorker(models=[model])
            raws[name] = raw
            entries.append({"name": name, "url": await raw.start(), "type": kind})

        async def stop() -> None:
            for raw in raws.values():
                await raw.stop()

        return entries, stop

    with tempfile.TemporaryDirectory() as tmp, threaded_gateway(Path(tmp), start) as (_, client):  # type: ignore[arg-type]
        yield client, raws["oa"], raws["ol"]


@WORKER_FUZZ
@given(data=st.data(), route=st.sampled_from(["/v1/chat/completions", "/api/chat", "/api/generate"]))
def test_worker_answers_never_reach_the_client_malformed(
    worker_gateway: tuple[Client, RawWorker, RawWorker], data: st.DataObject, route: str
) -> None:
    client, openai_worker, ollama_worker = worker_gateway
    # /v1 goes to the OpenAI-style worker or to Ollama's /v1; /api to Ollama as is or translated
    target = data.draw(st.sampled_from([openai_worker, ollama_worker]))
    speaks_ollama = target is ollama_worker and route.startswith("/api")
    target.default = data.draw(worker_replies(speaks_ollama))
    stream = data.draw(st.booleans())
    model = target.models[0]
    body = {"model": model, "messages": [{"role": "user", "content": "x"}], "prompt": "x", "stream": stream}
    status, ctype, payload = client.post(route, orjson.dumps(body))
    assert_well_formed(route, stream, status, ctype, payload)
