"""Hypothesis against the Responses translation: no client request and no worker answer or stream ever makes it
fail other than as it promises (a TranslationError for the client, a 400; a ResponseShapeError for the worker, a
502), and a stream that started always ends with exactly one terminal event, every event numbered in order."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnout.dialects import responses
from turnout.dialects.base import Call, Dialect, Endpoint, Timing, TranslationError, WorkerAPI
from turnout.dialects.responses.answer import ResponseShapeError
from turnout.errors import UpstreamError

TRANSLATION = responses.ON_CHAT
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
TIMING = Timing("2026-12-04T14:31:00Z", 2_000_000_000, 500_000_000)

scalars = st.none() | st.booleans() | st.integers(-5, 70000) | st.floats(allow_nan=False) | st.text(max_size=12)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
names = st.sampled_from(["f", "g", "ns__f", "apply_patch", "tool_search", "", "spawn_agent"])
parts = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "output_text", "input_image", "refusal", "input_file", "x"])},
    optional={"text": scalars, "image_url": scalars, "refusal": scalars, "detail": scalars},
)
items = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "developer"])},
        optional={"type": st.just("message"), "content": st.text(max_size=20) | st.lists(parts, max_size=3) | scalars},
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["function_call", "custom_tool_call", "tool_search_call"])},
        optional={"call_id": scalars, "name": names, "arguments": json_values, "input": scalars, "namespace": scalars},
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["function_call_output", "custom_tool_call_output", "tool_search_output"])},
        optional={"call_id": scalars, "output": json_values, "tools": json_values},
    ),
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(
                ["reasoning", "item_reference", "additional_tools", "compaction", "local_shell_call"]
            )
        },
        optional={"summary": json_values, "content": json_values, "encrypted_content": scalars, "tools": json_values},
    ),
    json_values,
)
tools = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["function", "custom", "tool_search"])},
        optional={"name": names, "parameters": json_values, "description": scalars, "format": json_values},
    ),
    st.fixed_dictionaries(
        {"type": st.just("namespace")},
        optional={
            "name": names,
            "tools": st.lists(json_values | st.fixed_dictionaries({"type": st.just("function"), "name": names})),
        },
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["web_search", "file_search", "mcp", "image_generation"])}),
    json_values,
)
requests = st.fixed_dictionaries(
    {"model": st.just("m")},
    optional={
        "input": st.text(max_size=20) | st.lists(items, max_size=6) | scalars,
        "instructions": st.text(max_size=10) | st.lists(items, max_size=2) | scalars,
        "tools": st.lists(tools, max_size=4) | scalars,
        "tool_choice": st.sampled_from(["auto", "none", "required", "x"])
        | st.fixed_dictionaries(
            {"type": st.sampled_from(["function", "custom", "allowed_tools", "web_search", "tool_search"])},
            optional={"name": names, "mode": scalars, "tools": json_values, "namespace": scalars},
        )
        | scalars,
        "max_output_tokens": scalars,
        "temperature": scalars,
        "top_p": scalars,
        "text": st.fixed_dictionaries({}, optional={"format": json_values, "verbosity": scalars}) | scalars,
        "reasoning": json_values,
        "parallel_tool_calls": scalars,
        "metadata": json_values,
        "store": scalars,
        "user": scalars,
    },
)


def call_of(payload: dict[str, Any], stream: bool) -> Call:
    body = json.dumps(payload).encode()
    return Call(Dialect.RESPONSES, Endpoint.RESPONSES, "/v1/responses", body, payload, "m", stream, None, "resp_f")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=requests, stream=st.booleans())
def test_any_request_is_translated_or_refused_with_a_reason(payload: dict[str, Any], stream: bool) -> None:
    call = call_of(payload, stream)
    responses.API.prompt_parts(call)  # never raises
    try:
        path, body = TRANSLATION.request(call, "m")
    except TranslationError as exc:
        assert str(exc)
        return
    assert path == "/v1/chat/completions"
    json.dumps(body)  # the worker's request is JSON
    assert all(m["role"] in ("system", "user", "assistant", "tool") for m in body["messages"])
    for tool in body.get("tools", []):
        assert tool["type"] == "function" and isinstance(tool["function"]["name"], str)
    TRANSLATION.headers(call)
    responses.API.session_key(call, {})


worker_calls = st.fixed_dictionaries(
    {},
    optional={
        "index": st.integers(0, 2) | scalars,
        "id": scalars,
        "type": scalars,
        "function": st.fixed_dictionaries(
            {}, optional={"name": names | scalars, "arguments": st.text(max_size=12) | json_values}
        )
        | scalars,
    },
)
deltas = st.fixed_dictionaries(
    {},
    optional={
        "role": scalars,
        "content": st.text(max_size=10) | scalars,
        "reasoning_content": st.text(max_size=10) | scalars,
        "reasoning": st.text(max_size=10) | scalars,
        "tool_calls": st.lists(worker_calls, max_size=2) | scalars,
    },
)
worker_events = st.fixed_dictionaries(
    {},
    optional={
        "choices": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "index": st.integers(0, 1) | scalars,
                    "delta": deltas | scalars,
                    "message": deltas | scalars,
                    "finish_reason": st.sampled_from(["stop", "length", "tool_calls", "content_filter", None, ""])
                    | scalars,
                },
            )
            | scalars,
            max_size=2,
        )
        | scalars,
        "usage": st.fixed_dictionaries({}, optional={"prompt_tokens": scalars, "completion_tokens": scalars}) | scalars,
    },
)
client_tools = st.lists(
    st.sampled_from(
        [
            {"type": "function", "name": "f"},
            {"type": "custom", "name": "apply_patch"},
            {"type": "tool_search"},
            {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "f"}]},
        ]
    ),
    max_size=4,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answer=worker_events, tools_=client_tools)
def test_any_worker_answer_is_turned_back_or_refused_as_a_shape_error(
    answer: dict[str, Any], tools_: list[Any]
) -> None:
    call = call_of({"model": "m", "input": "hi", "tools": tools_}, False)
    try:
        out, _ = TRANSLATION.answer(call, answer, TIMING)
    except ResponseShapeError:
        return
    json.dumps(out)
    assert out["status"] in ("completed", "incomplete") and out["output"]
    assert all(isinstance(item["id"], str) for item in out["output"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(worker_events, max_size=8), tools_=client_tools, broken=st.booleans())
def test_a_started_stream_always_ends_with_one_terminal_event(
    events: list[dict[str, Any]], tools_: list[Any], broken: bool
) -> None:
    translator = TRANSLATION.stream(call_of({"model": "m", "input": "hi", "tools": tools_, "stream": True}, True))
    out: list[dict[str, Any]] = []
    for event in events:
        try:
            out += translator.feed(event, TIMING.created_at)
        except ResponseShapeError:  # a chunk whose message cannot be read: the proxy ends the stream (fail)
            broken = True
            break
    if broken or translator.finish_reason is None:
        out += translator.fail(UpstreamError("w: broke"))
    else:
        final, _ = translator.finish(TIMING)
        out += final
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    assert [e["type"] for e in out if e["type"] in TERMINAL] == [out[-1]["type"]]
    for e in out:
        TRANSLATION.frame(e)  # every event can be framed
    if out[-1]["type"] != "response.failed":
        added = [e["output_index"] for e in out if e["type"] == "response.output_item.added"]
        done = [e["output_index"] for e in out if e["type"] == "response.output_item.done"]
        assert added == done == list(range(len(out[-1]["response"]["output"])))
        assert [e["item"] for e in out if e["type"] == "response.output_item.done"] == out[-1]["response"]["output"]


def test_the_translation_is_the_one_for_chat_workers() -> None:
    assert responses.API.translation(WorkerAPI.OLLAMA, Endpoint.RESPONSES, frozenset()) is TRANSLATION
