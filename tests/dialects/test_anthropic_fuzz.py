"""Hypothesis fuzzing of the Anthropic Messages translator and stream converters (pure, no gateway).

* Any client request: the worker's request is built (a JSON object) or the request is refused with a
  TranslationError (a 400 naming the field); nothing else is ever raised.
* Any worker answer: a Message of the right shape, or a ResponseShapeError (a 502); nothing else.
* Any sequence of worker stream events: every event converts, or one whose message cannot be read raises
  ResponseShapeError (the proxy ends the stream with an error event), however the events are batched; once the
  worker said why the model stopped, the Messages stream it gives is well formed (message_start, blocks opened and
  closed in order, deltas of the open block's kind, tool input that parses to an object) and ends with
  message_delta and message_stop.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.dialects.test_anthropic_golden import TIMING, assert_well_formed
from turnout.dialects import anthropic
from turnout.dialects.anthropic import answers, prompt
from turnout.dialects.anthropic.events import OllamaEvents, OpenAIEvents, sse_frame
from turnout.dialects.base import Call, Dialect, Endpoint, TranslationError

ints = st.integers(-(2**63), 2**63 - 1)  # what a JSON body decoded by orjson can hold
json_values = st.recursive(
    st.none() | st.booleans() | ints | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=16,
)
texts = st.text(max_size=12)
sources = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["base64", "url", "text", "content", "file"]) | json_values,
        "media_type": st.sampled_from(["image/png", "text/plain"]) | json_values,
        "data": texts | json_values,
        "url": texts | json_values,
        "content": json_values,
    },
)
blocks = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image", "document", "tool_use", "tool_result", "thinking", "search_result"])},
    optional={
        "text": texts | json_values,
        "source": sources | json_values,
        "id": texts | json_values,
        "name": texts | json_values,
        "input": json_values,
        "tool_use_id": texts | json_values,
        "content": texts | st.lists(st.deferred(lambda: blocks), max_size=2) | json_values,
        "is_error": st.booleans() | json_values,
        "thinking": texts | json_values,
        "cache_control": json_values,
    },
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "developer"]) | json_values},
        optional={"content": texts | st.lists(blocks | json_values, max_size=4) | json_values},
    )
    | json_values,
    max_size=5,
)
tools = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "name": texts | json_values,
            "type": st.sampled_from(["custom", "web_search_20250305"]) | json_values,
            "description": texts | json_values,
            "input_schema": json_values,
            "defer_loading": st.booleans(),
        },
    )
    | json_values,
    max_size=3,
)
requests = st.fixed_dictionaries(
    {"model": st.just("m")},
    optional={
        "messages": messages | json_values,
        "system": texts | st.lists(blocks | json_values, max_size=3) | json_values,
        "tools": tools | json_values,
        "tool_choice": st.fixed_dictionaries(
            {"type": st.sampled_from(["auto", "any", "tool", "none"]) | json_values},
            optional={"name": texts | json_values, "disable_parallel_tool_use": json_values},
        )
        | json_values,
        "max_tokens": ints | json_values,
        "temperature": st.floats(allow_nan=False) | json_values,
        "top_p": json_values,
        "top_k": ints | json_values,
        "stop_sequences": st.lists(texts, max_size=3) | json_values,
        "metadata": st.fixed_dictionaries({}, optional={"user_id": texts | json_values}) | json_values,
        "thinking": st.fixed_dictionaries({"type": st.sampled_from(["enabled", "adaptive", "disabled"])}) | json_values,
        "output_config": st.fixed_dictionaries({}, optional={"effort": texts | json_values}) | json_values,
        "stream": st.booleans(),
    },
)
FUZZ = settings(max_examples=200, deadline=None)


def call_of(body: dict[str, Any], endpoint: Endpoint = Endpoint.MESSAGES) -> Call:
    return Call(Dialect.ANTHROPIC, endpoint, "/v1/messages", orjson.dumps(body), body, "m", bool(body.get("stream")))


@FUZZ
@given(body=requests)
def test_any_request_translates_or_is_a_400(body: dict[str, Any]) -> None:
    call = call_of(body)
    for build in (
        lambda: anthropic.ON_OPENAI.request(call, "w")[1],
        lambda: anthropic.ON_OLLAMA.request(call, "w")[1],
        lambda: {"parts": anthropic.API.prompt_parts(call)},
        lambda: {"tokenize": anthropic.COUNT_ON_OPENAI.tokenize(call, "w")},
    ):
        try:
            out = build()
        except TranslationError as exc:
            assert str(exc)
            continue
        assert isinstance(out, dict)
        orjson.dumps(out)  # JSON all the way down
    session = anthropic.API.session_key(call, {})
    assert session is None or isinstance(session, str)


choices = st.fixed_dictionaries(
    {},
    optional={
        "index": st.integers(0, 2) | json_values,
        "message": st.fixed_dictionaries(
            {},
            optional={
                "content": texts | json_values,
                "reasoning_content": texts | json_values,
                "reasoning": texts | json_values,
                "tool_calls": st.lists(
                    st.fixed_dictionaries(
                        {},
                        optional={
                            "id": texts | json_values,
                            "function": st.fixed_dictionaries(
                                {}, optional={"name": texts | json_values, "arguments": texts | json_values}
                            )
                            | json_values,
                        },
                    )
                    | json_values,
                    max_size=3,
                )
                | json_values,
            },
        )
        | json_values,
        "delta": json_values,
        "finish_reason": st.sampled_from([None, "stop", "length", "tool_calls", "content_filter"]) | json_values,
        "stop_reason": texts | json_values,
    },
)
openai_answers = st.fixed_dictionaries(
    {},
    optional={
        "id": texts | json_values,
        "choices": st.lists(choices | json_values, max_size=2) | json_values,
        "usage": st.fixed_dictionaries(
            {},
            optional={
                "prompt_tokens": ints | json_values,
                "completion_tokens": ints | json_values,
                "prompt_tokens_details": st.fixed_dictionaries({}, optional={"cached_tokens": ints}) | json_values,
            },
        )
        | json_values,
    },
)
ollama_messages = st.fixed_dictionaries(
    {},
    optional={
        "content": texts | json_values,
        "thinking": texts | json_values,
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "id": texts | json_values,
                    "function": st.fixed_dictionaries(
                        {}, optional={"name": texts | json_values, "arguments": json_values}
                    )
                    | json_values,
                },
            )
            | json_values,
            max_size=2,
        )
        | json_values,
    },
)
ollama_answers = st.fixed_dictionaries(
    {},
    optional={
        "message": ollama_messages | json_values,
        "done": st.booleans() | json_values,
        "done_reason": st.sampled_from(["stop", "length", "load"]) | json_values,
        "prompt_eval_count": ints | json_values,
        "eval_count": ints | json_values,
        "eval_duration": ints | json_values,
    },
)
STOPS = {"end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"}


def assert_message(message: dict[str, Any]) -> None:
    assert message["type"] == "message" and message["role"] == "assistant" and message["stop_reason"] in STOPS
    for block in message["content"]:
        assert block["type"] in ("text", "thinking", "tool_use"), block
        if block["type"] == "tool_use":
            assert isinstance(block["input"], dict) and block["name"] and block["id"]
    usage = message["usage"]
    assert all(isinstance(usage[k], int) and usage[k] >= 0 for k in usage), usage
    orjson.dumps(message)


@FUZZ
@given(answer=openai_answers | json_values, stops=st.lists(texts, max_size=2))
def test_any_openai_answer_is_a_message_or_a_502(answer: Any, stops: list[str]) -> None:
    if not isinstance(answer, dict):
        return  # the proxy refuses an answer that is no JSON object before any translation
    try:
        message, counts = answers.message_from_openai(answer, "m", stops, 10, TIMING)
    except answers.ResponseShapeError:
        return
    assert_message(message)
    assert counts.prompt_tokens is None or counts.prompt_tokens >= 0


@FUZZ
@given(answer=ollama_answers)
def test_any_ollama_answer_is_a_message_or_a_502(answer: dict[str, Any]) -> None:
    try:
        message, _ = answers.message_from_ollama(answer, "m", 10, TIMING)
    except answers.ResponseShapeError:
        return
    assert_message(message)


openai_events = st.fixed_dictionaries(
    {},
    optional={
        "id": texts | json_values,
        "choices": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "index": st.integers(0, 1) | json_values,
                    "delta": st.fixed_dictionaries(
                        {},
                        optional={
                            "content": texts | json_values,
                            "reasoning_content": texts | json_values,
                            "tool_calls": st.lists(
                                st.fixed_dictionaries(
                                    {},
                                    optional={
                                        "index": st.integers(0, 2) | json_values,
                                        "id": texts | json_values,
                                        "function": st.fixed_dictionaries(
                                            {},
                                            optional={
                                                "name": st.sampled_from(["f", "g", ""]) | json_values,
                                                "arguments": st.sampled_from(['{"a":', " 1}", "{}", "[", ""])
                                                | json_values,
                                            },
                                        )
                                        | json_values,
                                    },
                                )
                                | json_values,
                                max_size=2,
                            )
                            | json_values,
                        },
                    )
                    | json_values,
                    "finish_reason": st.sampled_from([None, "stop", "length", "tool_calls"]) | json_values,
                    "stop_reason": texts | json_values,
                },
            )
            | json_values,
            max_size=2,
        )
        | json_values,
        "usage": json_values,
    },
)
ollama_events = st.fixed_dictionaries(
    {},
    optional={
        "message": ollama_messages | json_values,
        "done": st.booleans() | json_values,
        "done_reason": st.sampled_from(["stop", "length"]) | json_values,
        "prompt_eval_count": ints | json_values,
        "eval_count": ints | json_values,
        "eval_duration": ints | json_values,
    },
)


def run_stream(
    converter: OpenAIEvents | OllamaEvents, events: list[dict[str, Any]], cuts: list[int]
) -> tuple[list[dict[str, Any]], Any]:
    """Feed ``events`` in batches (split at ``cuts``), as reads of a worker's stream bring them."""
    bounds = [0, *sorted({c % (len(events) + 1) for c in cuts}), len(events)]
    out = [e for a, b in itertools.pairwise(bounds) if b > a for e in converter.feed(events[a:b], "t")]
    if converter.finish_reason is None:
        return out, None
    final, counts = converter.finish(TIMING)
    return out + final, counts


def content(stream: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Each block's type and everything its deltas carry, joined (what a client builds from the stream)."""
    blocks: list[tuple[str, str]] = []
    for event in stream:
        if event["type"] == "content_block_start":
            blocks.append((event["content_block"]["type"], ""))
        elif event["type"] == "content_block_delta":
            delta = event["delta"]
            piece = delta.get("text") or delta.get("thinking") or delta.get("partial_json") or ""
            blocks[-1] = (blocks[-1][0], blocks[-1][1] + piece)
    return blocks


def check_stream(make: Any, events: list[dict[str, Any]], cuts: list[int]) -> None:
    try:
        one_by_one, counts = run_stream(make(), [e for e in events], list(range(len(events) + 1)))
    except answers.ResponseShapeError:  # an event whose message cannot be read: the stream's error event
        with pytest.raises(answers.ResponseShapeError):
            run_stream(make(), events, cuts)
        return
    batched, batched_counts = run_stream(make(), events, cuts)
    assert content(batched) == content(one_by_one)  # batches join pieces, never change what the client builds
    if counts is None:  # the proxy ends such a stream with an error event, never a finish
        assert batched_counts is None
        assert not any(e["type"] in ("message_delta", "message_stop") for e in one_by_one + batched)
        return
    for stream in (one_by_one, batched):
        assert_well_formed(stream)
        for event in stream:
            assert sse_frame(event).endswith(b"\n\n")
    assert counts.completion_tokens is not None and counts.completion_tokens >= 0
    assert batched_counts == counts


cuts = st.lists(st.integers(0, 9), max_size=4)


@FUZZ
@given(events=st.lists(openai_events, max_size=8), stops=st.lists(texts, max_size=2), cuts=cuts)
def test_any_openai_stream_converts_to_a_well_formed_messages_stream(
    events: list[dict[str, Any]], stops: list[str], cuts: list[int]
) -> None:
    check_stream(lambda: OpenAIEvents("m", stops, 10), events, cuts)


@FUZZ
@given(events=st.lists(ollama_events, max_size=8), cuts=cuts)
def test_any_ollama_stream_converts_to_a_well_formed_messages_stream(
    events: list[dict[str, Any]], cuts: list[int]
) -> None:
    check_stream(lambda: OllamaEvents("m", 10), events, cuts)


def test_pieces_that_arrive_together_are_one_delta() -> None:
    """Text arriving in one read of the worker's stream is one text_delta (fewer frames when the worker outpaces
    the gateway); the output count still counts the pieces."""
    stream = OpenAIEvents("m", [], 10)
    chunk = [{"choices": [{"index": 0, "delta": {"content": word}}]} for word in ("Hel", "lo", " wor", "ld")]
    first = stream.feed(chunk[:1], "t")
    assert [e["type"] for e in first] == ["message_start", "content_block_start", "content_block_delta"]
    rest = stream.feed(chunk[1:], "t")
    assert rest == [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo world"}}]
    stream.feed([{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}], "t")
    final, counts = stream.finish(TIMING)
    assert final[-2]["usage"]["output_tokens"] == 4 and counts.completion_tokens == 4


@FUZZ
@given(body=requests, tokens=json_values | st.fixed_dictionaries({"tokens": st.lists(ints, max_size=5)}))
def test_a_token_count_is_always_a_count(body: dict[str, Any], tokens: Any) -> None:
    call = call_of(body, Endpoint.COUNT_TOKENS)
    try:
        anthropic.COUNT_ON_OPENAI.tokenize(call, "w")
    except TranslationError:
        return
    counted = anthropic.COUNT_ON_OPENAI.count(tokens) if isinstance(tokens, dict) else None
    answer = anthropic.COUNT_ON_OPENAI.answer(call, counted)
    assert isinstance(answer["input_tokens"], int) and answer["input_tokens"] >= 0


def test_prompt_module_keeps_its_fields() -> None:
    """The fields left out of the alternate request are exactly the ones that are not OpenAI's own."""
    assert set(prompt.EXTRA_FIELDS) == {"top_k", "reasoning_effort", "chat_template_kwargs"}
