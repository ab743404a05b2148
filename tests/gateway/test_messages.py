"""The Anthropic Messages API through a real gateway: the `anthropic` SDK and raw HTTP against real workers.

Workers: the real llama.cpp engine (``tiny``: gibberish, but real tokens, usage and streams; an OpenAI-style
worker, so calls are translated onto ``/v1/chat/completions``), the Ollama emulator as an Ollama worker
(translated onto ``/api/chat``), as an OpenAI-style worker (its ``/v1`` routes) and as a worker that serves the
Messages API itself (``native_apis: ["anthropic"]``, passed through). Each test says which rule it checks:
authentication (``x-api-key`` or Bearer), Anthropic's error shape with ``request-id``, usage rows and limits,
streams (ping while the worker is silent, ``event: error`` when it fails), count_tokens.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest

from tests.conftest import EmulatorFactory, Engine, Gateway, GatewayFactory, create_key, start_llama, worker
from tests.support.ollama_emulator import OllamaEmulator
from tests.support.raw_worker import RawWorker, Reply, http
from turnout.gateway.keys import ACCOUNTANT, USAGE

HI = [{"role": "user", "content": "hi"}]
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A llama.cpp engine of this module's own (the session engine's prompt cache stays out of it)."""
    started = start_llama(tiny_model, "tiny", tmp_path_factory.mktemp("llama-messages") / "server.log")
    yield started
    started.stop()


class Setup:
    def __init__(self, gw: Gateway, key: str, ollama: OllamaEmulator, lms: OllamaEmulator, native: OllamaEmulator):
        self.gw, self.key, self.ollama, self.lms, self.native = gw, key, ollama, lms, native
        self.url = gw.url

    def sdk(self, **options: Any) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(base_url=self.url, api_key=self.key, max_retries=0, **options)

    async def post(
        self, path: str, body: Any, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        sent = {"x-api-key": self.key, "content-type": "application/json"} if headers is None else headers
        async with aiohttp.ClientSession() as http, http.post(self.url + path, data=data, headers=sent) as r:
            return r.status, dict(r.headers), await r.read()


@pytest.fixture
async def setup(engine: Engine, emulator: EmulatorFactory, gateway: GatewayFactory) -> AsyncIterator[Setup]:
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    ollama = await emulator("ollama", ["qwen3:8b", "llama3.2:latest"], thinking_models=["qwen3:8b"], tool_call=call)
    lms = await emulator("lms", ["gpt-oss:20b"], tool_call=call)
    native = await emulator("native", ["native:1"], tool_call=call)
    gw = await gateway(
        [
            worker("llama", engine.url, type="openai"),
            worker("ollama", ollama.url),
            worker("lms", lms.url, type="openai"),
            worker("native", native.url, native_apis=["anthropic"]),
        ],
        auth={"open": False},
        limits={"stream_keepalive_s": 0.3},
    )
    _, key = create_key(gw, app="agents")
    yield Setup(gw, key, ollama, lms, native)


def sse(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event, data) of every event of an Anthropic stream; each must have both lines, the event naming the type."""
    assert data.endswith(b"\n\n"), data[-200:]
    events = []
    for raw in data.decode().split("\n\n")[:-1]:
        lines = raw.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), raw
        payload = json.loads(lines[1][6:])
        assert payload["type"] == lines[0][7:], raw
        events.append((lines[0][7:], payload))
    return events


def kinds(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [name for name, _ in events if name != "ping"]


async def usage_of(gw: Gateway, endpoint: str) -> list[dict[str, Any]]:
    """The usage rows of one route (``anthropic:messages``...), the pending ones written first."""
    await gw.app[ACCOUNTANT].usage.flush()
    rows: list[dict[str, Any]] = [r for r in gw.app[USAGE].summary(since=0) if r["endpoint"] == endpoint]
    return rows


# -- the SDK on llama.cpp -------------------------------------------------------------------------------------------
async def test_sdk_messages_create_and_stream_on_llama_cpp(setup: Setup) -> None:
    """messages.create and the messages.stream helper, translated onto llama.cpp's /v1/chat/completions."""
    async with setup.sdk() as client:
        message = await client.messages.create(model="tiny", max_tokens=6, messages=HI)
        assert message.type == "message" and message.role == "assistant" and message.model == "tiny"
        assert [block.type for block in message.content] in (["text"], [])
        assert message.stop_reason in ("end_turn", "max_tokens")
        assert message.usage.input_tokens > 0 and 1 <= message.usage.output_tokens <= 6
        assert message._request_id and message._request_id.startswith("req_")  # the request-id header

        async with client.messages.stream(model="tiny", max_tokens=6, messages=HI, system="be brief") as stream:
            events = [event async for event in stream]
            final = await stream.get_final_message()
        seen = [event.type for event in events]
        assert seen[0] == "message_start" and seen[-1] == "message_stop"
        assert "message_delta" in seen and final.stop_reason in ("end_turn", "max_tokens")
        deltas = [e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"]
        text = "".join(block.text for block in final.content if block.type == "text")
        # llama.cpp streams no usage: the output count is the pieces of text (several in one delta when they
        # arrived together)
        assert text == "".join(deltas) and len(deltas) <= final.usage.output_tokens <= 6
        assert final.usage.input_tokens > 0


async def test_x_api_key_and_bearer_are_both_keys(setup: Setup) -> None:
    """x-api-key is accepted wherever Bearer is (Messages, chat, models); none or a wrong one: 401 in the route's
    shape, with Anthropic's request-id on the Messages routes."""
    body = {"model": "tiny", "max_tokens": 2, "messages": HI}
    status, headers, _ = await setup.post("/v1/messages", body, {"x-api-key": setup.key})
    assert status == 200 and headers["request-id"].startswith("req_")
    status, _, _ = await setup.post("/v1/messages?beta=true", body, {"Authorization": f"Bearer {setup.key}"})
    assert status == 200
    chat = {"model": "tiny", "max_tokens": 2, "messages": HI}
    status, _, _ = await setup.post("/v1/chat/completions", chat, {"x-api-key": setup.key})
    assert status == 200
    async with (
        aiohttp.ClientSession() as http,
        http.get(setup.url + "/v1/models", headers={"x-api-key": setup.key}) as r,
    ):
        assert r.status == 200 and "tiny" in {m["id"] for m in (await r.json())["data"]}

    status, headers, data = await setup.post("/v1/messages", body, {})
    answer = json.loads(data)
    assert status == 401 and answer["type"] == "error" and answer["error"]["type"] == "authentication_error"
    assert "x-api-key" in answer["error"]["message"] and answer["request_id"] == headers["request-id"]
    async with anthropic.AsyncAnthropic(base_url=setup.url, api_key="tk_wrong", max_retries=0) as client:
        with pytest.raises(anthropic.AuthenticationError) as caught:
            await client.messages.create(model="tiny", max_tokens=2, messages=HI)
        assert caught.value.request_id and caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


async def test_errors_have_anthropics_shape(setup: Setup) -> None:
    """Every error on the Messages routes is {"type":"error","error":{type,message},"request_id"}, with the type of
    its status; the SDK raises its own exception for each."""
    async with setup.sdk() as client:
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.create(model="nope", max_tokens=2, messages=HI)
        with pytest.raises(anthropic.BadRequestError, match="messages"):
            await client.messages.create(model="tiny", max_tokens=2, messages="hi")  # type: ignore[arg-type]
    cases: list[tuple[str, Any, int, str]] = [
        ("/v1/messages", b"{not json", 400, "invalid_request_error"),
        ("/v1/messages", {"max_tokens": 2, "messages": HI}, 400, "invalid_request_error"),
        ("/v1/messages", {"model": "tiny", "messages": HI, "temperature": "hot"}, 400, "invalid_request_error"),
        ("/v1/messages", {"model": "ghost:1", "messages": HI}, 404, "not_found_error"),
        ("/v1/messages/batches", {"model": "tiny"}, 404, "not_found_error"),
        ("/v1/messages/count_tokens", {"model": "tiny", "messages": 3}, 400, "invalid_request_error"),
    ]
    for path, body, status, kind in cases:
        got, headers, data = await setup.post(path, body)
        answer = json.loads(data)
        assert (got, answer["type"], answer["error"]["type"]) == (status, "error", kind), (path, body, answer)
        assert answer["request_id"] == headers["request-id"]

    scoped = create_key(setup.gw, scopes=["llama3.2*"])[1]
    got, _, data = await setup.post("/v1/messages", {"model": "tiny", "messages": HI}, {"x-api-key": scoped})
    assert got == 403 and json.loads(data)["error"]["type"] == "permission_error"
    limited = create_key(setup.gw, rpm=1)[1]
    body = {"model": "llama3.2", "max_tokens": 2, "messages": HI}
    assert (await setup.post("/v1/messages", body, {"x-api-key": limited}))[0] == 200
    got, headers, data = await setup.post("/v1/messages", body, {"x-api-key": limited})
    assert got == 429 and json.loads(data)["error"]["type"] == "rate_limit_error" and int(headers["Retry-After"]) > 0


async def test_usage_rows_limits_and_access_log(setup: Setup, caplog: pytest.LogCaptureFixture) -> None:
    """A Messages call is a usage row of route anthropic:messages with the worker's own counts, settled against a
    daily token budget; count_tokens costs a request and no tokens (anthropic:count_tokens)."""
    record, key = create_key(setup.gw, daily_tokens=100_000)
    headers = {"x-api-key": key}
    caplog.set_level("INFO", logger="aiohttp.access")  # the test gateway's access logger
    body = {"model": "llama3.2", "max_tokens": 50, "messages": HI}
    assert (await setup.post("/v1/messages", body, headers))[0] == 200
    assert (await setup.post("/v1/messages", {**body, "stream": True}, headers))[0] == 200
    assert (await setup.post("/v1/messages/count_tokens", {"model": "llama3.2", "messages": HI}, headers))[0] == 200
    [messages] = [r for r in await usage_of(setup.gw, "anthropic:messages") if r["key"] == record.prefix]
    assert messages["requests"] == 2 and messages["worker"] == "ollama" and messages["errors"] == 0
    assert messages["prompt_tokens"] == 14 and messages["completion_tokens"] == 10  # the emulator's 7 + 5, twice
    [count] = [r for r in await usage_of(setup.gw, "anthropic:count_tokens") if r["key"] == record.prefix]
    assert count["requests"] == 1 and count["prompt_tokens"] == 0 and count["completion_tokens"] == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "aiohttp.access"]
    assert any("api=anthropic:messages model=llama3.2 worker=ollama tokens=7+5" in line for line in lines), lines
    assert any('"POST /v1/messages/count_tokens HTTP/1.1" 200' in line for line in lines), lines


async def test_sdk_lists_the_models(setup: Setup) -> None:
    """GET /v1/models with an anthropic-version header (as every Anthropic SDK sends) has Anthropic's fields beside
    OpenAI's, so both SDKs read the same listing; without it, it is OpenAI's as before."""
    async with setup.sdk() as client:
        listed = [model async for model in client.models.list()]
        assert {m.id for m in listed} == {"tiny", "qwen3:8b", "llama3.2:latest", "gpt-oss:20b", "native:1"}
        assert all(m.type == "model" and m.display_name == m.id and m.created_at.year >= 2000 for m in listed)
        one = await client.models.retrieve("tiny")
        assert one.id == "tiny" and one.type == "model"
    async with (
        aiohttp.ClientSession() as http,
        http.get(setup.url + "/v1/models", headers={"Authorization": f"Bearer {setup.key}"}) as r,
    ):
        assert set((await r.json())["data"][0]) == {"id", "object", "created", "owned_by"}


# -- translation onto Ollama (/api/chat) ----------------------------------------------------------------------------
async def test_onto_ollama_thinking_tools_and_history(setup: Setup) -> None:
    """/api/chat keeps thinking (both ways), tool calls as objects, tool names on tool results, top_k and images;
    a thinking request on a model that cannot think is no error (think is never sent as true)."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    history = [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}, image]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should call the tool.", "signature": "sig"},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C", "is_error": False}],
        },
        {"role": "system", "content": "<reminder>"},
    ]
    async with setup.sdk() as client:
        message = await client.messages.create(
            model="qwen3:8b", max_tokens=64, messages=HI, tools=[WEATHER], thinking={"type": "adaptive"}
        )
        assert [b.type for b in message.content] == ["thinking", "tool_use"] and message.stop_reason == "tool_use"
        assert message.content[1].input == {"city": "Paris"} and message.content[1].id.startswith("call_")  # type: ignore[union-attr]
        assert message.content[0].thinking == "[ollama thinks] t1"  # type: ignore[union-attr]
        assert message.usage.input_tokens == 7

        answer = await client.messages.create(
            model="qwen3:8b",
            max_tokens=64,
            messages=history,  # type: ignore[arg-type]
            tools=[WEATHER],
            system=[{"type": "text", "text": "You are helpful.", "cache_control": {"type": "ephemeral"}}],
            stop_sequences=["\n\nHuman:"],
            extra_body={"top_k": 5},  # the SDK no longer takes top_k; agents and other clients send it
        )
        assert answer.stop_reason == "end_turn" and [b.type for b in answer.content] == ["thinking", "text"]
        path, sent = setup.ollama.calls[-1]
        assert path == "/api/chat" and "think" not in sent
        # the SDK's anthropic-version (and any anthropic-beta) go nowhere but to a worker that speaks Anthropic
        assert not any(k.lower().startswith("anthropic-") for k in setup.ollama.headers_seen[-1])
        assert sent["options"] == {"num_predict": 64, "top_k": 5, "stop": ["\n\nHuman:"]}
        assert sent["messages"] == [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "weather?", "images": ["iVBORw0KGgo="]},
            {
                "role": "assistant",
                "content": "",
                "thinking": "I should call the tool.",
                "tool_calls": [
                    {"id": "toolu_1", "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}
                ],
            },
            {
                "role": "tool",
                "content": "18 C\n\n<reminder>",
                "tool_call_id": "toolu_1",
                "tool_name": "get_weather",
            },
        ]
        plain = await client.messages.create(
            model="llama3.2", max_tokens=8, messages=HI, thinking={"type": "enabled", "budget_tokens": 1024}
        )
        assert plain.content[0].text == "[ollama] w1 w2 w3 w4"  # type: ignore[union-attr]  # no 400 for think

        async with client.messages.stream(
            model="qwen3:8b", max_tokens=64, messages=HI, tools=[WEATHER], tool_choice={"type": "any"}
        ) as stream:
            seen = [event.type async for event in stream]
            final = await stream.get_final_message()
        assert [b.type for b in final.content] == ["thinking", "tool_use"] and final.stop_reason == "tool_use"
        assert final.content[1].input == {"city": "Paris"}  # type: ignore[union-attr]
        assert seen[0] == "message_start" and seen[-1] == "message_stop"


# -- translation onto an OpenAI-style worker (/v1/chat/completions) --------------------------------------------------
async def test_onto_openai_tool_calls_both_ways(setup: Setup) -> None:
    """Tool calls: the worker's JSON-string arguments become an input object; tool_use in history becomes
    tool_calls with a JSON string and the same id, tool_result a tool message (is_error kept as "Error: ")."""
    async with setup.sdk() as client:
        message = await client.messages.create(model="gpt-oss:20b", max_tokens=64, messages=HI, tools=[WEATHER])
        [call] = message.content
        assert call.type == "tool_use" and call.input == {"city": "Paris"} and message.stop_reason == "tool_use"
        history = [
            *HI,
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call.id,
                        "content": [{"type": "text", "text": "boom"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "try again"},
                ],
            },
        ]
        again = await client.messages.create(
            model="gpt-oss:20b",
            max_tokens=64,
            messages=history,  # type: ignore[arg-type]
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            metadata={"user_id": "u-1"},
            extra_body={"top_k": 3},
        )
        assert again.stop_reason == "tool_use"  # the emulator calls again: the last message is the user's
    path, sent = setup.lms.calls[-1]
    assert path == "/v1/chat/completions"
    assert sent["messages"][1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "Error: boom"},
        {"role": "user", "content": "try again"},
    ]
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER["description"],
                "parameters": WEATHER["input_schema"],
            },
        }
    ]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["parallel_tool_calls"] is False and sent["user"] == "u-1" and sent["top_k"] == 3


# -- pass-through to a worker that serves the Messages API ---------------------------------------------------------
async def test_native_worker_gets_the_call_unchanged(setup: Setup) -> None:
    """A worker with native_apis anthropic gets /v1/messages as sent, with anthropic-version and anthropic-beta
    (never the client's key); its stream is watched (usage, its end) and relayed."""
    headers = {
        "x-api-key": setup.key,
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "interleaved-thinking-2025-05-14,context-management-2025-06-27",
    }
    body = {"model": "native:1", "max_tokens": 9, "messages": HI, "context_management": {"edits": []}}
    status, _, data = await setup.post("/v1/messages?beta=true", body, headers)
    assert status == 200 and json.loads(data)["content"][0]["text"] == "[native] w1 w2 w3 w4"
    path, sent = setup.native.calls[-1]
    assert path == "/v1/messages" and sent == body
    seen = setup.native.headers_seen[-1]
    assert seen["anthropic-version"] == "2023-06-01" and seen["anthropic-beta"] == headers["anthropic-beta"]
    assert "x-api-key" not in {k.lower() for k in seen} and "Authorization" not in seen

    status, response_headers, data = await setup.post("/v1/messages", {**body, "stream": True}, headers)
    events = sse(data)
    assert status == 200 and kinds(events)[0] == "message_start" and kinds(events)[-1] == "message_stop"
    assert response_headers["request-id"].startswith("req_")
    [row] = await usage_of(setup.gw, "anthropic:messages")
    assert row["worker"] == "native" and row["prompt_tokens"] == 14 and row["completion_tokens"] == 10


async def test_native_stream_without_message_stop_gets_one(setup: Setup) -> None:
    setup.native.behaviour.native_no_stop = True
    body = {"model": "native:1", "max_tokens": 9, "messages": HI, "stream": True}
    status, _, data = await setup.post("/v1/messages", body)
    assert status == 200 and kinds(sse(data))[-2:] == ["message_delta", "message_stop"]


# -- streams that fail, and slow workers ----------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["llama3.2", "gpt-oss:20b", "native:1"])
async def test_a_stream_that_breaks_ends_with_an_error_event(setup: Setup, model: str) -> None:
    """Whichever way the call went (onto /api/chat, /v1/chat/completions, or passed through), a worker that drops
    the connection mid-stream gives `event: error`, never a silent end or a false end_turn."""
    for emu in (setup.ollama, setup.lms, setup.native):
        emu.behaviour.drop_after_chunks = 2
    body = {"model": model, "max_tokens": 9, "messages": HI, "stream": True}
    status, _, data = await setup.post("/v1/messages", body)
    events = sse(data)
    assert status == 200 and kinds(events)[0] == "message_start" and kinds(events)[-1] == "error", events
    assert "message_stop" not in kinds(events) and "message_delta" not in kinds(events)
    assert events[-1][1]["error"]["type"] == "api_error"


@pytest.mark.parametrize("model", ["llama3.2", "native:1"])
async def test_ping_while_the_worker_is_silent(setup: Setup, model: str) -> None:
    """A worker silent for longer than limits.stream_keepalive_s (0.3 s here): the client gets ping events, and the
    answer is whole."""
    setup.ollama.behaviour.token_delay_s = setup.native.behaviour.token_delay_s = 0.7
    setup.ollama.behaviour.tokens = 2
    body = {"model": model, "max_tokens": 9, "messages": HI, "stream": True}
    status, _, data = await setup.post("/v1/messages", body)
    events = sse(data)
    assert status == 200 and "ping" in [name for name, _ in events] and kinds(events)[-1] == "message_stop"
    assert events[-1][0] == "message_stop"


# -- count_tokens ---------------------------------------------------------------------------------------------------
async def test_count_tokens_from_the_tokenizer_or_the_estimate(setup: Setup, engine: Engine) -> None:
    """llama.cpp (its server's /tokenize) counts with the model's tokenizer; Ollama has none: the gateway's
    estimate. A header says which."""
    body = {"model": "tiny", "system": "be brief", "messages": [{"role": "user", "content": "hello world"}]}
    status, headers, data = await setup.post("/v1/messages/count_tokens", body)
    assert status == 200 and headers["X-Turnout-Token-Count"] == "tokenizer"
    async with (
        aiohttp.ClientSession() as http,
        http.post(engine.url + "/tokenize", json={"content": "be brief\nuser: hello world", "add_special": True}) as r,
    ):
        assert json.loads(data) == {"input_tokens": len((await r.json())["tokens"])}
    status, headers, data = await setup.post("/v1/messages/count_tokens", {**body, "model": "llama3.2"})
    assert status == 200 and headers["X-Turnout-Token-Count"] == "estimate"
    assert json.loads(data)["input_tokens"] == len("be brief\nuser: hello world") // 4
    async with setup.sdk() as client:
        counted = await client.messages.count_tokens(model="tiny", messages=HI, tools=[WEATHER])  # type: ignore[list-item]
        assert counted.input_tokens > 0


# -- what the real clients send -------------------------------------------------------------------------------------
GOLDEN = Path(__file__).parents[1] / "dialects" / "golden" / "anthropic"
CAPTURED = sorted(p for p in GOLDEN.glob("*.json") if "captured" in json.loads(p.read_text()))
PLACEHOLDERS = ("sk-ant-capture-dummy-key", "capture-dummy-bearer-token")


@pytest.mark.parametrize("worker_kind", ["ollama", "lms", "native"])
async def test_every_captured_request_is_taken(setup: Setup, worker_kind: str) -> None:
    """Each request captured from Claude Code and the anthropic SDK (tests/dialects/golden/anthropic), sent as it
    was (path with ?beta=true, every header, the body) with its placeholder key replaced by a real one, is
    answered whole by each kind of worker: translated onto /api/chat or /v1/chat/completions, or passed through."""
    model = {"ollama": "llama3.2", "lms": "gpt-oss:20b", "native": "native:1"}[worker_kind]
    for path in CAPTURED:
        case = json.loads(path.read_text())
        headers = {}
        for name, value in case["headers"]:
            for placeholder in PLACEHOLDERS:
                value = value.replace(placeholder, setup.key)
            headers[name] = value
        body = {**case["request"], "model": model}
        status, answer_headers, data = await setup.post(case["path"], body, headers)
        assert status == 200, (path.name, data[:500])
        assert answer_headers["request-id"].startswith("req_")
        if case.get("kind") == "count":
            assert json.loads(data)["input_tokens"] > 0
        elif body.get("stream"):
            events = sse(data)
            assert kinds(events)[0] == "message_start" and kinds(events)[-1] == "message_stop", (path.name, events)
        else:
            assert json.loads(data)["type"] == "message", (path.name, data[:500])


async def test_count_tokens_on_a_worker_that_serves_messages_itself(gateway: GatewayFactory) -> None:
    """An OpenAI-style worker with native_apis anthropic (llama-server) counts with its own count_tokens route (an
    Ollama one does not serve it: the gateway's estimate, test_every_captured_request_is_taken)."""
    raw = RawWorker(models=["n:1"])
    raw.default = Reply([http(200, b'{"input_tokens": 42}')])
    url = await raw.start()
    try:
        gw = await gateway([worker("server", url, type="openai", native_apis=["anthropic"])], auth={"open": True})
        body = {"model": "n:1", "messages": HI}
        async with (
            aiohttp.ClientSession() as http_session,
            http_session.post(gw.url + "/v1/messages/count_tokens", json=body) as r,
        ):
            assert r.status == 200 and await r.json() == {"input_tokens": 42}
            assert r.headers["X-Turnout-Token-Count"] == "tokenizer"
        assert [json.loads(p) for p in raw.posts] == [body]  # passed through as it was
    finally:
        await raw.stop()
