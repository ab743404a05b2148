"""``native_apis`` against a real llama.cpp server: its own Anthropic Messages and OpenAI Responses routes.

llama.cpp's server (tools/server) serves ``/v1/messages`` and ``/v1/responses`` itself. A worker configured with
``native_apis: ["anthropic", "responses"]`` gets those calls unchanged; a recording proxy in front of the engine
shows which route each call reached. Claude Code goes through Turnout to the engine's Messages route. The last
test pins where the engine's own routes answer otherwise than Turnout's translation onto its
``/v1/chat/completions`` (docs/api.md, "llama.cpp's own routes").
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from aiohttp import web

from tests.conftest import Engine, Gateway, GatewayFactory, create_key, serve_app, start_llama, start_smollm2, worker
from tests.gateway.test_claude_code import _prompt_tokens_evaluated
from tests.support.claude_code import run_claude
from tests.support.tiny_gguf import write_tiny_model

NATIVE = ["anthropic", "responses"]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    started = start_smollm2("smol", tmp_path_factory.mktemp("smollm2-native") / "server.log")
    yield started
    started.stop()


@pytest.fixture(scope="module")
def ending(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """The tiny model that ends its answers after a few tokens, with room for Claude Code's whole prompt (about
    15,000 of its tokens; its chat template has no tools, so llama-server leaves them out)."""
    folder = tmp_path_factory.mktemp("llama-claude-native")
    started = start_llama(
        write_tiny_model(folder / "ending.gguf", eos_logit=2.2), "tiny-coder", folder / "log", "--ctx-size", "24576"
    )
    yield started
    started.stop()


class Recorder:
    """A reverse proxy in front of the engine that records the path of every request (and its JSON body)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.calls: list[tuple[str, Any]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.calls.append((request.path, json.loads(body) if body else None))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with (
            aiohttp.ClientSession() as http,
            http.request(request.method, self.upstream + request.path_qs, data=body, headers=headers) as up,
        ):
            out = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers["Content-Type"]})
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    def paths(self) -> list[str]:
        return [p for p, _ in self.calls if p.startswith("/v1/") and p != "/v1/models"]


@asynccontextmanager
async def recording(engine: Engine) -> AsyncIterator[tuple[str, Recorder]]:
    rec = Recorder(engine.url)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", rec.handle)
    url, runner = await serve_app(app)
    try:
        yield url, rec
    finally:
        await runner.cleanup()


@pytest.fixture
async def recorder(smol: Engine) -> AsyncIterator[tuple[str, Recorder]]:
    async with recording(smol) as found:
        yield found


async def native_gateway(gateway: GatewayFactory, url: str, name: str = "smol") -> tuple[Gateway, str]:
    gw = await gateway([worker(name, url, type="openai", native_apis=NATIVE)], auth={"open": False})
    return gw, create_key(gw)[1]


async def test_messages_reach_llama_servers_own_route(recorder: tuple[str, Recorder], gateway: GatewayFactory) -> None:
    url, rec = recorder
    gw, key = await native_gateway(gateway, url)
    async with anthropic.AsyncAnthropic(base_url=gw.url, api_key=key, max_retries=0, timeout=120) as client:
        answer = await client.messages.create(model="smol", max_tokens=24, messages=QUESTION)  # type: ignore[arg-type]
        async with client.messages.stream(model="smol", max_tokens=24, messages=QUESTION) as stream:  # type: ignore[arg-type]
            streamed = await stream.get_final_message()
        called = await client.messages.create(
            model="smol",
            max_tokens=48,
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "any"},
        )
    assert answer.content[0].type == "text" and "Paris" in answer.content[0].text
    assert answer.id.startswith("chatcmpl-")  # llama-server's own id: Turnout's translation answers msg_...
    assert streamed.content[0].type == "text" and streamed.content[0].text == answer.content[0].text
    [use] = called.content
    assert use.type == "tool_use" and use.name == "get_weather" and isinstance(use.input, dict)
    assert called.stop_reason == "tool_use"
    assert rec.paths() == ["/v1/messages"] * 3  # unchanged, on the engine's route: never /v1/chat/completions


async def test_claude_code_through_turnout_to_llama_servers_messages_route(
    ending: Engine, gateway: GatewayFactory, tmp_path: Path
) -> None:
    async with recording(ending) as (url, rec):
        gw, key = await native_gateway(gateway, url, "tiny-coder")
        run = await run_claude(gw.url, "tiny-coder", "say hi", tmp_path, auth_token=key)
    assert run.returncode == 0, (run.stdout, run.stderr)
    assert rec.paths() and set(rec.paths()) == {"/v1/messages"}, rec.paths()
    sent = [body for path, body in rec.calls if path == "/v1/messages"][-1]
    assert sent["model"] == "tiny-coder" and sent["tools"] and sent["system"]  # Claude Code's request as it sent it
    # and all of it reached the model: llama.cpp evaluated Claude Code's whole prompt (its log counts the tokens)
    evaluated = _prompt_tokens_evaluated(Path(ending.log.name))
    assert evaluated and max(evaluated) > 10_000, evaluated


async def test_responses_reach_llama_servers_own_route_and_the_gateway_keeps_the_conversation(
    recorder: tuple[str, Recorder], gateway: GatewayFactory
) -> None:
    """llama-server stores nothing (it refuses ``previous_response_id``: "llama.cpp does not support
    'previous_response_id'"): the gateway's stored responses carry the conversation to it."""
    url, rec = recorder
    gw, key = await native_gateway(gateway, url)
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0, timeout=120) as oa:
        first = await oa.responses.create(model="smol", input="My name is Zorblax.", max_output_tokens=16)
        second = await oa.responses.create(
            model="smol", input="What is my name?", previous_response_id=first.id, max_output_tokens=16
        )
        stream = await oa.responses.create(model="smol", input="What is the capital of France?", stream=True)
        events = [event.type async for event in stream]
        again = await oa.responses.retrieve(first.id)
    assert first.output_text and second.output_text and again.id == first.id
    assert events[0] == "response.created" and events[-1] == "response.completed"
    assert rec.paths() == ["/v1/responses"] * 3
    carried = [body for path, body in rec.calls if path == "/v1/responses"][1]  # (the poller reads /props too)
    assert "previous_response_id" not in carried and "Zorblax" in json.dumps(carried["input"])


async def test_where_llama_servers_own_routes_differ_from_turnouts_translation(
    smol: Engine, gateway: GatewayFactory
) -> None:
    """The same requests, greedy, on the engine's own routes and translated onto its chat route."""
    native = await gateway([worker("smol", smol.url, type="openai", native_apis=NATIVE)])
    translated = await gateway([worker("smol", smol.url, type="openai")])

    async def post(gw: Gateway, path: str, body: dict[str, Any]) -> tuple[dict[str, str], str]:
        async with aiohttp.ClientSession() as http, http.post(gw.url + path, json=body) as r:
            assert r.status == 200, await r.text()
            return dict(r.headers), await r.text()

    message = {"model": "smol", "max_tokens": 24, "messages": QUESTION}
    own, ours = [json.loads((await post(gw, "/v1/messages", message))[1]) for gw in (native, translated)]
    assert own["content"] == ours["content"]  # the same answer
    assert own["id"].startswith("chatcmpl-") and ours["id"].startswith("msg_")
    assert "cache_creation_input_tokens" not in own["usage"] and "cache_creation_input_tokens" in ours["usage"]
    counted = [json.loads((await post(gw, "/v1/messages/count_tokens", message))[1]) for gw in (native, translated)]
    assert counted[0]["input_tokens"] > counted[1]["input_tokens"]  # the engine counts its chat template's tokens
    cut = {"model": "smol", "input": "Tell me a long story.", "max_output_tokens": 4}
    own, ours = [json.loads((await post(gw, "/v1/responses", cut))[1]) for gw in (native, translated)]
    assert own["status"] == "completed" and "incomplete_details" not in own  # cut at max_output_tokens all the same
    assert ours["status"] == "incomplete" and ours["incomplete_details"] == {"reason": "max_output_tokens"}
    assert "instructions" not in own and "max_output_tokens" not in own and ours["max_output_tokens"] == 4
    frames = [
        [
            json.loads(line[6:])
            for line in (await post(gw, "/v1/responses", {**cut, "stream": True}))[1].splitlines()
            if line.startswith("data: ")
        ]
        for gw in (native, translated)
    ]
    assert all("sequence_number" not in f for f in frames[0]) and "timings" in frames[0][-1]
    assert [f["sequence_number"] for f in frames[1]] == list(range(len(frames[1])))
    assert frames[0][-1]["type"] == "response.completed" and frames[1][-1]["type"] == "response.incomplete"
