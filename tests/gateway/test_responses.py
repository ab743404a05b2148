"""POST /v1/responses end to end: the openai SDK against a real gateway, real llama.cpp and the Ollama emulator.

Workers: the real llama.cpp engine on the tiny generated model (gibberish, but real tokens, usage and streams), an
Ollama emulator as an Ollama worker (the call translated onto its OpenAI route), and one configured with
``native_apis: ["responses"]`` (Ollama serves the Responses API itself: the call passed through). Every rule of the
chat route holds: keys, scopes, limits, usage rows (``openai:responses``), the access log; stored responses belong
to the key's app.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from tests.conftest import EmulatorFactory, Engine, Gateway, GatewayFactory, create_key, free_port, start_llama, worker
from tests.gateway.test_usage_accounting import usage_rows
from tests.support.ollama_emulator import OllamaEmulator

TERMINAL = ("response.completed", "response.incomplete", "response.failed")


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A llama.cpp engine of this module's own (its prompt cache stays out of the other modules' counts)."""
    started = start_llama(tiny_model, "tiny", tmp_path_factory.mktemp("llama-responses") / "server.log")
    yield started
    started.stop()


def client(gw: Gateway, key: str = "unused", prefix: str = "") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gw.url}{prefix}/v1", api_key=key, max_retries=0)


async def post(
    gw: Gateway, body: dict[str, Any], key: str | None = None, path: str = "/v1/responses"
) -> tuple[int, bytes, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http, http.post(f"{gw.url}{path}", json=body, headers=headers) as r:
        return r.status, await r.read(), r.headers


def events(raw: bytes) -> list[dict[str, Any]]:
    """The data objects of an SSE body, each checked against its event: line."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        obj = json.loads(lines["data"])
        assert lines.get("event", obj["type"]) == obj["type"]
        out.append(obj)
    return out


def well_ended(stream: list[dict[str, Any]]) -> str:
    """The stream's terminal event type, after checking it numbers every event and ends exactly once."""
    assert [e["sequence_number"] for e in stream] == list(range(len(stream)))
    ends = [e["type"] for e in stream if e["type"] in TERMINAL]
    assert ends == [stream[-1]["type"]], ends
    return ends[0]


async def test_openai_sdk_on_llama_cpp_create_stream_retrieve_items_delete(
    engine: Engine, gateway: GatewayFactory
) -> None:
    gw = await gateway([worker("llama", engine.url, type="openai")], auth={"open": False})
    _, key = create_key(gw, app="sdk")
    async with client(gw, key) as oa:
        first = await oa.responses.create(
            model="tiny", input="hello there", instructions="be short", max_output_tokens=6, temperature=0
        )
        assert first.id.startswith("resp_") and first.object == "response" and first.model == "tiny"
        assert first.status in ("completed", "incomplete") and first.output_text
        assert first.usage is not None and first.usage.input_tokens > 5 and 0 < first.usage.output_tokens <= 6
        assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
        # streamed: the SDK's typed events (a cut-off answer ends with response.incomplete, as OpenAI's does)
        stream = await oa.responses.create(
            model="tiny",
            input=[{"role": "user", "content": "more"}],
            max_output_tokens=5,
            previous_response_id=first.id,
            stream=True,
            temperature=0,  # greedy: an answer with text (the tiny model's sampling makes none about 1 time in 20)
        )
        seen = [event async for event in stream]
        types = [event.type for event in seen]
        assert types[:2] == ["response.created", "response.in_progress"] and types[-1] in TERMINAL[:2]
        assert [e.sequence_number for e in seen] == list(range(len(seen)))
        second = seen[-1].response  # type: ignore[union-attr]
        assert "response.output_text.delta" in types and second.previous_response_id == first.id
        # stored: retrieved, its input items listed newest first (and oldest first, a page at a time)
        assert (await oa.responses.retrieve(second.id)).output_text == second.output_text
        items = await oa.responses.input_items.list(second.id)
        assert [i.type for i in items.data] == ["message", "message", "message"]
        assert [i.role for i in items.data] == ["user", "assistant", "user"]  # type: ignore[union-attr]
        page = await oa.responses.input_items.list(second.id, order="asc", limit=2)
        assert [i.role for i in page.data] == ["user", "assistant"] and page.has_more  # type: ignore[union-attr]
        rest = await oa.responses.input_items.list(second.id, order="asc", after=page.data[-1].id)
        assert [i.role for i in rest.data] == ["user"] and not rest.has_more  # type: ignore[union-attr]
        await oa.responses.delete(second.id)
        with pytest.raises(openai.NotFoundError, match=second.id):
            await oa.responses.retrieve(second.id)
        with pytest.raises(openai.NotFoundError):
            await oa.responses.delete(second.id)
    rows = [r for r in await usage_rows(gw) if r["endpoint"] == "openai:responses"]
    assert sum(r["requests"] for r in rows) == 2 and all(r["errors"] == 0 for r in rows)
    assert sum(r["prompt_tokens"] for r in rows) > 10 and sum(r["completion_tokens"] for r in rows) > 0


async def test_a_json_schema_format_reaches_llama_cpp_in_the_form_it_takes(
    engine: Engine, gateway: GatewayFactory
) -> None:
    """text.format json_schema reaches llama.cpp's server as OpenAI's json_schema response_format, which it takes
    and holds the answer to (llama-cpp-python's server refused that form: the retry in its own form is tested
    against a worker that refuses it, tests/gateway/test_worker_misbehaviour.py)."""
    gw = await gateway([worker("llama", engine.url, type="openai")])
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    text_format = {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}
    # room for the whitespace the grammar lets the random model write (48 tokens ran out in 8 of 300 answers straight
    # from llama-server, "incomplete" here; 256 in none of 300: tests/gateway/test_llama_engine.py says more)
    ask = {"model": "tiny", "input": "answer", "text": text_format, "max_output_tokens": 256}
    status, raw, _ = await post(gw, ask)
    answer = orjson.loads(raw)
    assert status == 200 and answer["text"]["format"]["name"] == "answer", answer
    assert answer["status"] == "completed", answer
    text = answer["output"][-1]["content"][0]["text"]
    assert isinstance(json.loads(text)["ok"], bool)  # constrained by the schema's grammar


async def test_a_continuation_rebuilds_the_whole_conversation_for_any_worker(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    emu = await emulator("emu", ["qwen3:8b"])
    gw = await gateway([worker("emu", emu.url)])  # an Ollama worker: the call goes to its OpenAI route
    async with client(gw) as oa:
        one = await oa.responses.create(model="qwen3:8b", input="first", instructions="only here")
        # streamed through the SDK's helper, which accumulates the events and checks them as it goes
        async with oa.responses.stream(model="qwen3:8b", input="second", previous_response_id=one.id) as stream:
            deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
            two = await stream.get_final_response()
        assert "".join(deltas) == two.output_text and two.status == "completed"
        three = await oa.responses.create(
            model="qwen3:8b", input="third", previous_response_id=two.id, instructions="now"
        )
        assert three.output_text.startswith("[emu]")
        path, sent = emu.calls[-1]
        assert path == "/v1/chat/completions"
        # the previous instructions are not carried over (OpenAI's rule); every turn and answer is
        assert [(m["role"], m["content"]) for m in sent["messages"]] == [
            ("system", "now"),
            ("user", "first"),
            ("assistant", one.output_text),
            ("user", "second"),
            ("assistant", two.output_text),
            ("user", "third"),
        ]
        # store: false keeps nothing
        gone = await oa.responses.create(model="qwen3:8b", input="x", store=False)
        assert gone.store is False
        with pytest.raises(openai.NotFoundError, match="no stored response"):
            await oa.responses.create(model="qwen3:8b", input="y", previous_response_id=gone.id)
        with pytest.raises(openai.NotFoundError):
            await oa.responses.retrieve(gone.id)


async def test_a_stored_response_belongs_to_its_app(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("emu", ["qwen3:8b"])
    gw = await gateway([worker("emu", emu.url)], auth={"open": False})
    _, mine = create_key(gw, app="mine")
    _, same_app = create_key(gw, app="mine")
    _, other = create_key(gw, app="other")
    async with client(gw, mine) as oa:
        kept = await oa.responses.create(model="qwen3:8b", input="secret")
    async with client(gw, other) as oa:
        with pytest.raises(openai.NotFoundError):
            await oa.responses.retrieve(kept.id)
        with pytest.raises(openai.NotFoundError):
            await oa.responses.input_items.list(kept.id)
        with pytest.raises(openai.NotFoundError):
            await oa.responses.create(model="qwen3:8b", input="x", previous_response_id=kept.id)
        with pytest.raises(openai.NotFoundError):
            await oa.responses.delete(kept.id)
    async with client(gw, same_app) as oa:  # another key of the same app
        assert (await oa.responses.retrieve(kept.id)).id == kept.id
        await oa.responses.delete(kept.id)
    async with client(gw, "tk_wrong") as oa:
        with pytest.raises(openai.AuthenticationError):
            await oa.responses.retrieve(kept.id)


async def test_hosted_tools_are_dropped_and_said_in_a_header_and_the_access_log(
    emulator: EmulatorFactory, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    emu = await emulator("emu", ["qwen3:8b"])
    gw = await gateway([worker("emu", emu.url)])
    tools = [{"type": "web_search", "external_web_access": False}, {"type": "function", "name": "f", "parameters": {}}]
    caplog.set_level(
        logging.INFO, "aiohttp.access"
    )  # the test gateway's access logger (turnout serve's: turnout.access)
    for stream in (False, True):
        status, raw, headers = await post(gw, {"model": "qwen3:8b", "input": "hi", "tools": tools, "stream": stream})
        assert status == 200 and headers["X-Turnout-Dropped-Tools"] == "web_search"
        if stream:
            assert well_ended(events(raw)) == "response.completed"
    assert [t["function"]["name"] for t in emu.calls[-1][1]["tools"]] == ["f"]
    lines = [r.getMessage() for r in caplog.records if r.name == "aiohttp.access" and "/v1/responses" in r.getMessage()]
    assert len(lines) == 2 and all("api=openai:responses" in x and "dropped_tools=web_search" in x for x in lines)


async def test_a_native_worker_gets_the_call_unchanged_and_is_accounted(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    emu = await emulator("native", ["qwen3:8b"])
    gw = await gateway([worker("native", emu.url, native_apis=["responses"])], auth={"open": False})
    _, key = create_key(gw, app="n")
    body = {"model": "qwen3:8b", "input": "hi", "tools": [{"type": "web_search"}], "reasoning": {"effort": "low"}}
    status, raw, headers = await post(gw, body, key)
    assert status == 200 and "X-Turnout-Dropped-Tools" not in headers
    assert emu.calls[-1] == ("/v1/responses", body)  # nothing lost in translation
    answer = orjson.loads(raw)
    status, raw, _ = await post(
        gw, {**body, "stream": True, "previous_response_id": answer["id"], "input": "more"}, key
    )
    stream = events(raw)
    assert status == 200 and well_ended(stream) == "response.completed"
    sent = emu.calls[-1][1]
    assert "previous_response_id" not in sent  # the worker never saw that id: it gets the whole conversation
    assert [i.get("role") for i in sent["input"]] == ["user", "assistant", "user"]
    async with client(gw, key) as oa:  # the worker's own ids, stored by the gateway
        assert (await oa.responses.retrieve(stream[-1]["response"]["id"])).output_text.startswith("[native]")
    rows = [r for r in await usage_rows(gw) if r["endpoint"] == "openai:responses"]
    assert sum(r["requests"] for r in rows) == 2 and sum(r["prompt_tokens"] for r in rows) == 14
    assert sum(r["completion_tokens"] for r in rows) == 10 and all(r["errors"] == 0 for r in rows)


@pytest.mark.parametrize("native", [True, False])
async def test_a_stream_cut_short_ends_with_response_failed_numbered_on(
    emulator: EmulatorFactory, gateway: GatewayFactory, native: bool
) -> None:
    emu = await emulator("emu", ["qwen3:8b"], drop_after_chunks=2)
    extra = {"native_apis": ["responses"]} if native else {}
    gw = await gateway([worker("emu", emu.url, **extra)])
    status, raw, _ = await post(gw, {"model": "qwen3:8b", "input": "hi", "stream": True})
    stream = events(raw)
    assert status == 200 and well_ended(stream) == "response.failed"
    assert stream[-1]["response"]["status"] == "failed"
    assert stream[-1]["response"]["error"]["message"].startswith("emu: ")  # the worker's failure, named
    assert [e["type"] for e in stream].count("response.output_text.delta") == 2
    rows = [r for r in await usage_rows(gw) if r["endpoint"] == "openai:responses"]
    assert [r["errors"] for r in rows] == [1]


@pytest.mark.parametrize("native", [True, False])
async def test_a_client_that_hangs_up_right_after_response_completed_was_served(
    emulator: EmulatorFactory, gateway: GatewayFactory, native: bool
) -> None:
    """Codex closes the connection the moment it has response.completed, before the body's end: that is a served
    request (usage settled, no error), not a client abort."""
    emu = await emulator("emu", ["qwen3:8b"], tokens=20)
    gw = await gateway([worker("emu", emu.url, **({"native_apis": ["responses"]} if native else {}))])
    body = orjson.dumps({"model": "qwen3:8b", "input": "hi", "stream": True, "store": False})
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
    seen = b""
    while b"response.completed" not in seen:
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        assert chunk, seen
        seen += chunk
    writer.transport.abort()  # a reset, at once, as a client that has what it wanted
    rows = [r for r in await usage_rows(gw) if r["endpoint"] == "openai:responses"]
    assert [(r["requests"], r["errors"]) for r in rows] == [(1, 0)], rows
    assert rows[0]["completion_tokens"] == 20


async def test_keys_scopes_and_limits_hold(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("emu", ["qwen3:8b", "other:1b"])
    gw = await gateway([worker("emu", emu.url)], auth={"open": False})
    status, raw, _ = await post(gw, {"model": "qwen3:8b", "input": "hi"})
    assert status == 401 and orjson.loads(raw)["error"]["code"] == "missing_api_key"
    _, scoped = create_key(gw, scopes=["other:*"])
    status, raw, _ = await post(gw, {"model": "qwen3:8b", "input": "hi"}, scoped)
    assert status == 403 and orjson.loads(raw)["error"]["code"] == "model_not_allowed"
    _, limited = create_key(gw, rpm=1)
    assert (await post(gw, {"model": "qwen3:8b", "input": "hi"}, limited))[0] == 200
    status, raw, headers = await post(gw, {"model": "qwen3:8b", "input": "hi"}, limited)
    assert status == 429 and int(headers["Retry-After"]) >= 1 and "error" in orjson.loads(raw)
    _, budget = create_key(gw, daily_tokens=100)  # max_output_tokens is reserved before the call
    status, raw, _ = await post(gw, {"model": "qwen3:8b", "input": "hi", "max_output_tokens": 500}, budget)
    assert status == 429 and "daily token limit" in orjson.loads(raw)["error"]["message"]
    status, raw, _ = await post(gw, {"model": "nope", "input": "hi"}, create_key(gw)[1])
    assert status == 404 and orjson.loads(raw)["error"]["code"] == "model_not_found"
    status, raw, _ = await post(gw, {"model": "qwen3:8b", "input": 5}, create_key(gw)[1])
    assert status == 400 and "input must be" in orjson.loads(raw)["error"]["message"]
    status, raw, _ = await post(gw, {"model": "qwen3:8b", "input": "x", "store": "yes"}, create_key(gw)[1])
    assert status == 400 and '"store"' in orjson.loads(raw)["error"]["message"]


async def test_endpoint_own_url_serves_the_responses_routes(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    from tests.gateway.test_endpoints import PRIVATE_OK, admin

    mac = await emulator("mac", ["qwen2.5:7b"])
    gw = await gateway([], env=PRIVATE_OK, auth={"open": False})
    status, reg = await admin(gw, "POST", "/admin/api/endpoints", {"name": "mac", "url": mac.url, "api": "ollama"})
    assert status == 201, reg
    async with client(gw, reg["key"], "/endpoints/mac") as oa:
        answer = await oa.responses.create(model="qwen2.5:7b", input="hi")
        assert answer.model == "qwen2.5:7b" and answer.output_text.startswith("[mac]")
        assert (await oa.responses.retrieve(answer.id)).id == answer.id
        assert len((await oa.responses.input_items.list(answer.id)).data) == 1
        await oa.responses.delete(answer.id)
    status, raw, _ = await post(gw, {"model": "x", "input": "hi"}, reg["key"], "/endpoints/nope/v1/responses")
    assert status == 404 and orjson.loads(raw)["error"]["code"] == "endpoint_not_found"


async def test_an_endpoints_fallback_takes_a_continuation(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    """The endpoint fails (HTTP 500): its fallback model, on a worker that serves the API itself, gets the whole
    conversation, not the previous_response_id it could not know."""
    from tests.gateway.test_endpoints import PRIVATE_OK, admin

    fleet = await emulator("fleet", ["llama3.2:latest"])
    mac = await emulator("mac", ["qwen2.5:7b"])
    gw = await gateway([worker("gpu", fleet.url, native_apis=["responses"])], env=PRIVATE_OK)
    spec = {"name": "mac", "url": mac.url, "api": "ollama", "fallback_model": "llama3.2:latest"}
    assert (await admin(gw, "POST", "/admin/api/endpoints", spec))[0] == 201
    async with client(gw) as oa:
        first = await oa.responses.create(model="mac/qwen2.5:7b", input="one")
        mac.behaviour.fail_status = 500
        raw = await oa.responses.with_raw_response.create(
            model="mac/qwen2.5:7b", input="two", previous_response_id=first.id
        )
    assert raw.headers["X-Fallback-From"] == "mac/qwen2.5:7b"
    assert raw.parse().output_text.startswith("[fleet]")
    path, sent = fleet.calls[-1]
    assert path == "/v1/responses" and sent["model"] == "llama3.2:latest" and "previous_response_id" not in sent
    assert [i.get("role") for i in sent["input"]] == ["user", "assistant", "user"]


@pytest.mark.parametrize("native", [True, False])
async def test_a_stream_still_running_when_the_gateway_stops_ends_with_response_failed(
    emulator: EmulatorFactory, tmp_path: Path, native: bool
) -> None:
    """`turnout serve` stopping (SIGTERM) past its drain timeout: the stream's last event is response.failed,
    numbered on, saying so; never a silent cut."""
    from tests.support.cli import TURNOUT
    from tests.support.served import Served

    emu = await emulator("emu", ["qwen3:8b"], tokens=40, token_delay_s=0.2)
    config = tmp_path / "config.json"
    extra = {"native_apis": ["responses"]} if native else {}
    config.write_text(
        json.dumps(
            {
                "storage": {"data_dir": str(tmp_path / "data")},
                "auth": {"open": True},
                "workers": [worker("emu", emu.url, **extra)],
            }
        )
    )
    port = free_port()
    served = Served(
        [*TURNOUT, "serve", "--config", str(config), "--port", str(port), "--drain-timeout", "1"],
        tmp_path,
        {**os.environ, "TURNOUT_ADMIN_TOKEN": "t"},
    )
    try:
        await asyncio.to_thread(served.wait_for, "serving on", 60)  # the emulator answers its polls meanwhile
        body = {"model": "qwen3:8b", "input": "hi", "stream": True}
        async with aiohttp.ClientSession() as http, http.post(f"http://127.0.0.1:{port}/v1/responses", json=body) as r:
            first = await r.content.readuntil(b"\n\n")
            served.proc.send_signal(signal.SIGTERM)
            rest = b""
            with contextlib.suppress(aiohttp.ClientPayloadError):  # the connection closes with the last event
                async for piece in r.content.iter_any():
                    rest += piece
        assert await asyncio.to_thread(served.wait, 60) == 0
    finally:
        served.kill()
    stream = events(first + rest)
    assert well_ended(stream) == "response.failed"
    assert "the gateway stopped before this answer was complete" in stream[-1]["response"]["error"]["message"]
    assert 0 < [e["type"] for e in stream].count("response.output_text.delta") < 40


async def test_the_gateways_metrics_count_the_route(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu: OllamaEmulator = await emulator("emu", ["qwen3:8b"])
    gw = await gateway([worker("emu", emu.url)])
    assert (await post(gw, {"model": "qwen3:8b", "input": "hi"}))[0] == 200
    async with aiohttp.ClientSession() as http, http.get(f"{gw.url}/metrics") as r:
        text = await r.text()
    assert 'api="responses",endpoint="/v1/responses",status="200"' in text
