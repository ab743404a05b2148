"""A stream asked for a call answered in one piece, made whole (turnout.gateway.preemption.made_whole): the same
answer however the worker's bytes are split, and any stream that is cut short, broken or of the wrong shape is the
worker's failure (UpstreamError: a 502, a Batch API line's attempt that failed), never another exception."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnout.dialects.openai_whole import whole_chat
from turnout.errors import UpstreamError
from turnout.gateway.preemption import made_whole


class _Worker:
    name = "w"

    def record_progress(self, now: float) -> None:
        pass


class _Lease:
    worker = _Worker()
    answered = 0

    def answering(self, now: float) -> None:
        self.answered += 1


class _Up:
    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts
        self.abandoned = False
        self.later: float | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part

    def abandon(self) -> None:
        self.abandoned = True

    def finish_later(self, limit_s: float) -> None:
        self.later = limit_s


def frame(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


STREAM = b"".join(
    [
        frame(chunk({"role": "assistant", "content": None})),
        frame(chunk({"content": "Red, "})),
        frame(chunk({"content": "green ünd blue"})),
        frame(chunk({}, "stop")),
        frame(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "m",
                "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
            }
        ),
        b"data: [DONE]\n\n",
    ]
)


def whole(parts: list[bytes]) -> dict[str, Any]:
    return orjson.loads(asyncio.run(made_whole(_Up(parts), _Lease(), whole_chat, 1.0)))  # type: ignore[arg-type]


def test_the_stream_made_whole() -> None:
    answer = whole([STREAM])
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "Red, green ünd blue"}
    assert answer["usage"]["total_tokens"] == 7 and answer["object"] == "chat.completion"


@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_the_same_answer_however_the_bytes_are_split(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    parts = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert whole([p for p in parts if p]) == whole([STREAM])


@pytest.mark.parametrize(
    ("parts", "why"),
    [
        ([STREAM[: STREAM.index(b"data: [DONE]")]], "ended before the model finished"),  # closed without [DONE]
        ([frame(chunk({"content": "a"})), b"data: [DONE]\n\n"], "ended before the model finished"),  # no finish
        ([frame(chunk({"content": "a"})), frame({"error": {"message": "boom"}})], "boom"),  # its error frame
        ([b"data: {not json\n\n"], "not valid JSON"),
        ([frame({"choices": "x"}), b"data: [DONE]\n\n"], "unexpected shape"),
        ([b"event\n\n"], "not an SSE field"),
    ],
)
def test_a_broken_stream_is_the_workers_failure(parts: list[bytes], why: str) -> None:
    with pytest.raises(UpstreamError, match=why):
        whole(parts)


@settings(max_examples=200)
@given(st.binary(max_size=200), st.integers(0, len(STREAM)))
def test_any_bytes_are_an_answer_or_the_workers_failure(noise: bytes, at: int) -> None:
    with contextlib.suppress(UpstreamError):
        whole([STREAM[:at], noise, STREAM[at:]])
