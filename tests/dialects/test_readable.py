"""What a translation reads of a worker's answer (:mod:`turnout.dialects.readable`): a table of shapes, and
Hypothesis properties over every translation onto a chat worker (Ollama, Anthropic Messages, Responses) and onto an
Ollama worker (Anthropic Messages): whatever the worker answers, the client's answer either carries the worker's
text or the translation refuses the answer (ResponseShapeError: the proxy's 502, or the stream's error frame).
Never an empty success (issue 32, item 9).
"""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnout.dialects import anthropic, ollama, responses
from turnout.dialects.anthropic.events import OllamaEvents, OpenAIEvents
from turnout.dialects.base import Call, Dialect, Endpoint, Timing
from turnout.dialects.readable import (
    ResponseShapeError,
    answer_message,
    check_chunks,
    chunk_delta,
    chunk_text,
    completion_text,
    first_choice,
    ollama_message,
)
from turnout.dialects.responses.stream import ResponsesStream

TIMING = Timing(created_at="2026-12-05T10:00:00Z", total_ns=2_000_000_000, first_token_ns=500_000_000)
MARK = "Paris is the capital"  # the worker's text, to be found in the client's answer
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Refused(str):
    """A table entry's expected refusal: a fragment of the ResponseShapeError's message."""


@pytest.mark.parametrize(
    ("choice", "read"),
    [
        ({"message": {"role": "assistant", "content": "x"}}, "x"),
        ({"message": {"role": "assistant", "content": None, "tool_calls": []}}, ""),
        ({"message": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}, "ab"),
        ({"message": {"content": None, "refusal": "no"}}, "no"),  # OpenAI's refusal: its text
        ({"message": {"content": "", "reasoning_content": "think"}}, ""),
        ({"message": "x"}, Refused("choices[0].message is a string, not a message object")),
        ({"delta": {"content": "x"}}, Refused("a stream chunk, not a whole answer")),
        ({"text": "x"}, Refused("choices[0].message is null")),
        ({"message": {"role": "assistant"}}, Refused("no content, tool calls or reasoning")),
        ({"message": {"content": 5}}, Refused("content is a number, not text")),
        ({"message": {"content": [{"type": "image_url"}]}}, Refused("content is a list, not text")),
    ],
)
def test_a_whole_answers_message(choice: dict[str, Any], read: str) -> None:
    if isinstance(read, Refused):
        with pytest.raises(ResponseShapeError, match=re.escape(read)):
            answer_message(choice)
    else:
        assert answer_message(choice)["content"] == read


@pytest.mark.parametrize(
    ("choice", "read"),
    [
        ({"delta": {"content": "x"}}, {"content": "x"}),
        ({"delta": {}, "finish_reason": "stop"}, {}),
        ({"index": 0, "finish_reason": "stop"}, None),  # a choice that only finishes
        ({"delta": {"content": [{"type": "text", "text": "x"}]}}, {"content": "x"}),
        ({"message": {"content": "x"}}, Refused("a message and no delta")),
        ({"message": {"content": "x"}, "finish_reason": "stop"}, Refused("a message and no delta")),
        ({"text": "x"}, Refused("a delta that is null")),
        ({"delta": "x"}, Refused("a delta that is a string")),
        ({}, Refused("a delta that is null")),
    ],
)
def test_a_stream_chunks_delta(choice: dict[str, Any], read: Any) -> None:
    if isinstance(read, Refused):
        with pytest.raises(ResponseShapeError, match=re.escape(read)):
            chunk_delta(choice)
    else:
        assert chunk_delta(choice) == read


def test_completions_and_ollama_shapes() -> None:
    assert completion_text({"text": "x"}) == "x" and chunk_text({"finish_reason": "stop"}) == ""
    with pytest.raises(ResponseShapeError, match="text is null"):
        completion_text({"message": {"content": "x"}})
    with pytest.raises(ResponseShapeError, match="text is null"):
        chunk_text({"delta": {"content": "x"}})
    with pytest.raises(ResponseShapeError, match="has no choices"):
        first_choice({"choices": []})
    assert ollama_message({"message": {"content": "x"}}) == {"content": "x"}
    assert ollama_message({"done": True}, chunk=True) is None  # the last object of a stream may have none
    for bad in ({"response": "x", "done": True}, {"message": "x"}, {"message": {"content": ["x"]}}):
        with pytest.raises(ResponseShapeError):
            ollama_message(bad)
    with pytest.raises(ResponseShapeError, match="choices is a string"):
        check_chunks([{"choices": []}, {"choices": "x"}])


# -- properties: the worker's text reaches the client, or the answer is refused ----------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
# where a worker may put its text: a content string, text parts, a message that is a string, a choice's text...
texts = st.sampled_from(
    [
        {"message": {"role": "assistant", "content": MARK}},
        {"message": {"role": "assistant", "content": [{"type": "text", "text": MARK}]}},
        {"message": MARK},
        {"message": {"role": "assistant", "content": {"text": MARK}}},
        {"message": {"role": "assistant", "content": [MARK]}},
        {"delta": {"role": "assistant", "content": MARK}},
        {"delta": MARK},
        {"text": MARK},
        {"message": {"text": MARK}},
    ]
)
choices = st.builds(
    lambda text, extra, finish: {**extra, **text, "index": 0, "finish_reason": finish},
    texts,
    st.dictionaries(st.sampled_from(["logprobs", "stop_reason", "native"]), json_values, max_size=2),
    st.sampled_from(["stop", "length", None]),
)


def call_of(dialect: Dialect, endpoint: Endpoint, payload: dict[str, Any], stream: bool) -> Call:
    body = orjson.dumps(payload)
    return Call(dialect, endpoint, "/x", body, payload, "m", stream, None, "resp_1", estimate=7)


OLLAMA = call_of(Dialect.OLLAMA, Endpoint.CHAT, {"model": "m", "messages": []}, False)
MESSAGES = call_of(Dialect.ANTHROPIC, Endpoint.MESSAGES, {"model": "m", "max_tokens": 9, "messages": []}, False)
RESPONSES = call_of(Dialect.RESPONSES, Endpoint.RESPONSES, {"model": "m", "input": "hi"}, False)


def client_answers(answer: dict[str, Any]) -> list[Any]:
    """Each translation's client answer for a worker's whole chat answer (a ResponseShapeError in place of the
    answer it refused)."""
    out: list[Any] = []
    for call, translation in (
        (OLLAMA, ollama.ON_OPENAI),
        (MESSAGES, anthropic.ON_OPENAI),
        (RESPONSES, responses.ON_CHAT),
    ):
        try:
            out.append(translation.answer(call, answer, TIMING)[0])
        except ResponseShapeError as exc:
            out.append(exc)
    return out


@FUZZ
@given(choice=choices, usage=st.none() | json_values)
def test_a_whole_answer_keeps_the_workers_text_or_is_refused(choice: dict[str, Any], usage: Any) -> None:
    answer = {"id": "c", "object": "chat.completion", "choices": [choice], **({"usage": usage} if usage else {})}
    readable = isinstance(choice.get("message"), dict) and (
        choice["message"].get("content") in (MARK, [{"type": "text", "text": MARK}])
    )
    for translated in client_answers(answer):
        if readable:
            assert not isinstance(translated, Exception), translated
            assert MARK in orjson.dumps(translated).decode()
        else:  # the text is where a whole chat answer does not keep it: refused, never an empty success
            assert isinstance(translated, ResponseShapeError), translated


def client_stream(kind: str, events: list[dict[str, Any]]) -> str | ResponseShapeError:
    """A stream translation's whole client stream as text, or the ResponseShapeError that ended it."""
    stream: Any
    if kind == "ollama":
        stream = ollama.ON_OPENAI.stream(OLLAMA._replace(stream=True))
    elif kind == "anthropic":
        stream = OpenAIEvents("m", [], 7)
    else:
        stream = ResponsesStream(RESPONSES.payload, responses.request.tool_names(RESPONSES.payload), "resp_1", "m")
    try:
        out = [frame for event in events for frame in stream.feed([event], TIMING.created_at)]
    except ResponseShapeError as exc:
        return exc
    if stream.finish_reason is not None:
        out += stream.finish(TIMING)[0]
    return orjson.dumps(out).decode()


@FUZZ
@given(first=choices, rest=st.lists(choices, max_size=2), kind=st.sampled_from(["ollama", "anthropic", "responses"]))
def test_a_stream_keeps_the_workers_text_or_ends_with_an_error(
    first: dict[str, Any], rest: list[dict[str, Any]], kind: str
) -> None:
    events = [{"object": "chat.completion.chunk", "choices": [choice]} for choice in (first, *rest)]
    readable = all(isinstance(e["choices"][0].get("delta"), dict) for e in events)
    said = client_stream(kind, events)
    if readable:
        assert isinstance(said, str) and MARK in said
    else:
        assert isinstance(said, ResponseShapeError), said


@FUZZ
@given(
    message=st.sampled_from([{"role": "assistant", "content": MARK}, MARK, {"content": [MARK]}, None]) | json_values,
    field=st.sampled_from(["message", "response"]),
)
def test_an_ollama_answer_keeps_the_workers_text_or_is_refused(message: Any, field: str) -> None:
    """An Anthropic client's call on an Ollama worker (``/api/chat``): whole answer and stream."""
    answer = {"model": "m", field: message, "done": True, "done_reason": "stop"}
    readable = field == "message" and isinstance(message, dict) and isinstance(message.get("content"), str | None)
    try:
        translated: Any = anthropic.ON_OLLAMA.answer(MESSAGES, answer, TIMING)[0]
    except ResponseShapeError as exc:
        translated = exc
    chunk = {"model": "m", field: message, "done": False}
    stream = OllamaEvents("m", 7)
    try:
        streamed: Any = stream.feed([chunk], TIMING.created_at)
    except ResponseShapeError as exc:
        streamed = exc
    if readable:
        assert not isinstance(translated, Exception) and not isinstance(streamed, Exception)
        if message.get("content") == MARK:
            assert MARK in orjson.dumps(translated).decode() and MARK in orjson.dumps(streamed).decode()
    else:
        assert isinstance(translated, ResponseShapeError) and isinstance(streamed, ResponseShapeError)
