"""An OpenAI stream made whole (turnout.dialects.openai_whole): the answer in one piece from its chunks, checked by
the official openai SDK's models; and fuzzed (any frames: an answer or ValueError, nothing else)."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnout.dialects.openai_whole import whole_chat, whole_completion


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    index: int = 0,
    logprobs: dict[str, Any] | None = None,
    **top: Any,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "finish_reason": finish, "logprobs": logprobs}
    if delta is not None:
        choice["delta"] = delta
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "m",
        "choices": [choice],
        **top,
    }


USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def test_text_in_pieces_is_one_message_with_the_usage_and_llamacpp_timings() -> None:
    frames = [
        chunk({"role": "assistant", "content": None}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({}, "stop", timings={"prompt_n": 5, "predicted_n": 3}),
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 7,
            "model": "m",
            "choices": [],
            "usage": USAGE,
        },
    ]
    answer = whole_chat(frames)
    parsed = openai.types.chat.ChatCompletion.model_validate(answer)
    assert parsed.id == "chatcmpl-1" and parsed.object == "chat.completion" and parsed.created == 7
    assert parsed.choices[0].message.content == "Hello" and parsed.choices[0].finish_reason == "stop"
    assert parsed.usage is not None and parsed.usage.total_tokens == 8
    assert answer["timings"] == {"prompt_n": 5, "predicted_n": 3}


def test_tool_calls_in_pieces_and_reasoning() -> None:
    frames = [
        chunk({"role": "assistant", "reasoning_content": "think"}),
        chunk({"reasoning_content": "ing"}),
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get", "arguments": ""}}
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "call_2", "function": {"name": "put", "arguments": "{}"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}),
        chunk({}, "tool_calls"),
    ]
    answer = whole_chat(frames)
    message = openai.types.chat.ChatCompletion.model_validate(answer).choices[0].message
    assert message.content is None and answer["choices"][0]["message"]["reasoning_content"] == "thinking"
    assert message.tool_calls is not None
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [  # type: ignore[union-attr]
        ("call_1", "get", '{"a": 1}'),
        ("call_2", "put", "{}"),
    ]


def test_logprobs_and_several_choices() -> None:
    lp = [{"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []}]
    frames = [
        chunk({"role": "assistant", "content": "a"}, index=1, logprobs={"content": lp}),
        chunk({"role": "assistant", "content": "b"}, index=0, logprobs={"content": lp}),
        chunk({"content": "a"}, "length", index=1, logprobs={"content": lp}),
        chunk({}, "stop", index=0),
    ]
    answer = whole_chat(frames)
    parsed = openai.types.chat.ChatCompletion.model_validate(answer)
    assert [c.index for c in parsed.choices] == [0, 1]
    assert [c.message.content for c in parsed.choices] == ["b", "aa"]
    assert [c.finish_reason for c in parsed.choices] == ["stop", "length"]
    assert parsed.choices[1].logprobs is not None and len(parsed.choices[1].logprobs.content or []) == 2


def test_a_text_completion() -> None:
    frames = [
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 3,
            "model": "m",
            "choices": [{"index": 0, "text": "ab", "finish_reason": None}],
        },
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 3,
            "model": "m",
            "choices": [{"index": 0, "text": "c", "finish_reason": "length"}],
        },
        {"id": "cmpl-1", "object": "text_completion", "created": 3, "model": "m", "choices": [], "usage": USAGE},
    ]
    answer = whole_completion(frames)
    parsed = openai.types.Completion.model_validate(answer)
    assert parsed.object == "text_completion" and parsed.choices[0].text == "abc"
    assert parsed.choices[0].finish_reason == "length" and parsed.usage is not None


@pytest.mark.parametrize(
    "frame",
    [
        {"choices": "x"},
        {"choices": [1]},
        {"choices": [{"index": -1}]},
        {"choices": [{"index": True}]},
        {"choices": [{"delta": "x"}]},
        {"choices": [{"delta": {"content": 3}}]},
        {"choices": [{"delta": {"tool_calls": {}}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": "0"}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"function": {"arguments": 1}}]}}]},
        {"choices": [{"logprobs": {"content": 1}}]},
        {"choices": [], "usage": 5},
    ],
)
def test_a_frame_of_the_wrong_shape_is_a_value_error(frame: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        whole_chat([frame])


json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "index",
                    "delta",
                    "content",
                    "tool_calls",
                    "function",
                    "arguments",
                    "name",
                    "logprobs",
                    "choices",
                    "usage",
                    "text",
                    "finish_reason",
                    "role",
                    "id",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@given(st.lists(json, max_size=5))
def test_any_frames_give_an_answer_or_a_value_error(frames: list[Any]) -> None:
    for whole in (whole_chat, whole_completion):
        try:
            answer = whole(frames)
        except ValueError:
            continue
        assert isinstance(answer["choices"], list)


@given(st.lists(st.text(max_size=6), max_size=8))
def test_content_in_any_pieces_is_the_whole_text(pieces: list[str]) -> None:
    frames = [chunk({"content": p}) for p in pieces] + [chunk({}, "stop")]
    assert whole_chat(frames)["choices"][0]["message"]["content"] == "".join(pieces)
