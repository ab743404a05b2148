"""A stopped chat line continued from what it had answered (turnout.gateway.preemption: continued, partial_of,
joining, as_stream): which requests are continued and how, what a stopped stream had answered, and the answer and
usage of a continuation, as one request would have given them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.dialects.test_openai_whole import chunk
from turnout.dialects.base import Endpoint
from turnout.dialects.openai_whole import whole_chat
from turnout.gateway.preemption import Partial, Stoppable, as_stream, continued, joining, partial_of

ASK = {"model": "m", "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 24}
PARTIAL = Partial("Red, green", 3)


def said(text: str) -> dict[str, Any]:
    """A chat stream frame carrying ``text`` (one token, as llama-server streams them)."""
    return chunk({"content": text})


def test_a_plain_request_is_continued_with_the_partial_answer_and_fewer_tokens() -> None:
    body = continued(ASK, PARTIAL)
    assert body is not None
    assert body["messages"] == [*ASK["messages"], {"role": "assistant", "content": "Red, green"}]
    assert body["max_tokens"] == 21 and ASK["max_tokens"] == 24  # (the request itself unchanged)
    both = continued({**ASK, "max_completion_tokens": 10}, PARTIAL)
    assert both is not None and both["max_completion_tokens"] == 7 and both["max_tokens"] == 21
    unbounded = continued({k: v for k, v in ASK.items() if k != "max_tokens"}, PARTIAL)
    assert unbounded is not None and "max_tokens" not in unbounded


@pytest.mark.parametrize(
    ("change", "partial"),
    [
        ({}, None),  # nothing answered yet
        ({}, Partial("", 0)),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, PARTIAL),
        ({"response_format": {"type": "json_object"}}, PARTIAL),
        ({"logprobs": True}, PARTIAL),
        ({"n": 2}, PARTIAL),
        ({"max_tokens": 3}, PARTIAL),  # nothing left to answer: sent as it is
        ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "its own start"}]}, PARTIAL),
        ({"messages": []}, PARTIAL),
        ({"messages": "text"}, PARTIAL),
    ],
)
def test_what_is_not_continued(change: dict[str, Any], partial: Partial | None) -> None:
    assert continued({**ASK, **change}, partial) is None


def test_what_a_stopped_stream_had_answered() -> None:
    frames = [chunk({"role": "assistant", "content": None}), said("Red"), said(","), said(" green"), said("")]
    assert partial_of(frames, None) == Partial("Red, green", 3)
    assert partial_of([said(" and"), said(" blue")], PARTIAL) == Partial("Red, green and blue", 5)
    assert partial_of(None, PARTIAL) == PARTIAL  # stopped before it was sent as a stream: what it had
    assert partial_of([chunk({"role": "assistant"})], PARTIAL) == PARTIAL  # stopped before its first token
    assert partial_of([chunk({"role": "assistant"})], None) is None


@pytest.mark.parametrize(
    "frame",
    [
        chunk(
            {"tool_calls": [{"index": 0, "id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}]}
        ),
        chunk({"reasoning_content": "let me think"}),
        chunk({"content": "other"}, index=1),
        {"choices": [{"index": 0, "delta": "not an object"}]},
    ],
)
def test_a_stream_that_is_not_plain_text_is_started_over(frame: dict[str, Any]) -> None:
    assert partial_of([said("Red"), frame], PARTIAL) is None


def test_a_continuation_is_answered_as_one_request() -> None:
    frames = [chunk({"role": "assistant"}), said(" and"), said(" blue"), chunk({}, finish="length")]
    usage = {"prompt_tokens": 16, "completion_tokens": 2, "total_tokens": 18}
    frames.append(chunk(usage=usage) | {"choices": []})
    answer = joining(whole_chat, PARTIAL)(frames)
    assert answer["choices"][0]["message"]["content"] == "Red, green and blue"
    assert answer["choices"][0]["finish_reason"] == "length"
    # the engine read the partial answer as prompt (13 + 3): billed as the one answer, 13 in and 5 out
    assert answer["usage"] == {"prompt_tokens": 13, "completion_tokens": 5, "total_tokens": 18}


def test_as_stream_continues_only_a_stopped_chat_line() -> None:
    stop = Stoppable(partial=PARTIAL)
    sent, whole = as_stream(ASK, Endpoint.CHAT, whole_chat, stop)
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["messages"][-1] == {"role": "assistant", "content": "Red, green"} and whole is not whole_chat
    plain, same = as_stream(ASK, Endpoint.CHAT, whole_chat, Stoppable())
    assert plain["messages"] == ASK["messages"] and same is whole_chat
    completion = {"model": "m", "prompt": "The capital of France is", "max_tokens": 12}
    kept, also = as_stream(completion, Endpoint.COMPLETIONS, whole_chat, stop)
    assert kept["prompt"] == completion["prompt"] and kept["max_tokens"] == 12 and also is whole_chat
