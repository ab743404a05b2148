"""Responses SSE framing (StreamKind.RESPONSES): how a Responses stream passed through from a worker that serves the
API itself ended, decided by parsing its events, for every way of chunking it; and the gateway's own last frame
for one that broke (response.failed, numbered on)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnout.dialects import responses
from turnout.dialects.streams import FrameError, StreamKind, StreamWatch
from turnout.errors import UpstreamError

HEAD = {"id": "resp_w1", "object": "response", "created_at": 1796394245, "model": "qwen3", "status": "in_progress"}
USAGE = {"input_tokens": 11, "output_tokens": 3, "total_tokens": 14}


def event(kind: str, seq: int | None, event_line: bool = True, **fields: object) -> bytes:
    obj: dict[str, object] = {"type": kind, **fields}
    if seq is not None:
        obj["sequence_number"] = seq
    head = f"event: {kind}\n".encode() if event_line else b""
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


def stream(texts: list[str], end: str | None = "response.completed", event_lines: bool = True) -> bytes:
    seq = iter(range(100))
    out = event("response.created", next(seq), event_lines, response=HEAD)
    out += event("response.in_progress", next(seq), event_lines, response=HEAD)
    for text in texts:
        out += event("response.output_text.delta", next(seq), event_lines, item_id="msg_1", delta=text)
    if end == "response.failed":
        out += event(end, next(seq), event_lines, response={**HEAD, "status": "failed", "error": {"message": "oom"}})
    elif end is not None:
        out += event(end, next(seq), event_lines, response={**HEAD, "status": "completed", "usage": USAGE})
    return out


def run(data: bytes, cuts: list[int] | None = None) -> tuple[StreamWatch, bytes]:
    watch = StreamWatch(StreamKind.RESPONSES)
    out = b""
    start = 0
    for cut in [*sorted(set(cuts or [])), len(data)]:
        piece = data[start:cut]
        start = cut
        if piece:
            out += watch.feed(piece)
    if not watch.ended:
        watch.close()
    return watch, out


@pytest.mark.parametrize(
    ("data", "finished", "truncated", "error"),
    [
        (stream(["a", "b"]), True, False, None),
        (stream(["a"], "response.incomplete"), True, False, None),
        (stream(["a"], "response.failed"), False, False, "oom"),
        (stream(["a"], None), False, True, None),  # closed before a terminal event
        (stream(["a"], None) + b"data: [DONE]\n\n", False, True, None),  # [DONE] is no terminal event here
        (stream(["a"], event_lines=False), True, False, None),  # data: lines only, as Codex also takes them
        # an error event is forwarded; only a terminal event ends the stream
        (stream([], None) + event("error", 2, message="slow down"), False, True, None),
        (stream(["response.completed is only text here"], None), False, True, None),
        (b'data: {"error": {"message": "bad key"}}\n\n', False, False, "bad key"),
    ],
)
def test_how_responses_streams_end(data: bytes, finished: bool, truncated: bool, error: str | None) -> None:
    watch, _ = run(data)
    assert (watch.finished, watch.truncated, watch.error) == (finished, truncated, error)


def test_usage_sequence_and_response_are_kept() -> None:
    watch, out = run(stream(["a", "b", "c"]))
    assert watch.usage == {"prompt_tokens": 11, "completion_tokens": 3}
    assert watch.sequence == 5 and watch.events == 3
    assert watch.response == HEAD
    assert watch.final is not None and watch.final["type"] == "response.completed"
    assert out == stream(["a", "b", "c"])


def test_nothing_after_the_terminal_event_is_forwarded() -> None:
    data = stream(["a"])
    watch, out = run(data + event("response.output_text.delta", 9, delta="late"))
    assert watch.finished and out == data


def test_a_broken_pass_through_stream_ends_with_response_failed_numbered_on() -> None:
    watch, _ = run(stream(["a", "b"], None))
    frame = responses.API.error_frame(UpstreamError("w: the stream ended before the model finished"), watch)
    assert frame.startswith(b"event: response.failed\ndata: ")
    failed = orjson.loads(frame.split(b"data: ", 1)[1])
    assert failed["sequence_number"] == watch.sequence + 1 == 4
    assert failed["response"]["id"] == "resp_w1" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["message"] == "w: the stream ended before the model finished"
    # and one that broke before the worker said anything
    failed = orjson.loads(
        responses.API.error_frame(UpstreamError("x"), StreamWatch(StreamKind.RESPONSES)).split(b"data: ")[1]
    )
    assert failed["sequence_number"] == 0 and failed["type"] == "response.failed"


@pytest.mark.parametrize("frame", [b"data: not json\n\n", b"data: [1]\n\n", b"hello\n\n"])
def test_a_frame_that_is_not_an_event_is_an_error(frame: bytes) -> None:
    with pytest.raises(FrameError):
        StreamWatch(StreamKind.RESPONSES).feed(frame)


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(st.text(max_size=20), max_size=6),
    end=st.sampled_from([None, "response.completed", "response.incomplete", "response.failed"]),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12),
    crlf=st.booleans(),
    event_lines=st.booleans(),
)
def test_chunking_never_changes_the_verdict(
    texts: list[str], end: str | None, cuts: list[int], crlf: bool, event_lines: bool
) -> None:
    data = stream(texts, end, event_lines)
    if crlf:
        data = data.replace(b"\n", b"\r\n")
    whole, whole_out = run(data)
    pieces, pieces_out = run(data, [c % (len(data) + 1) for c in cuts])
    verdict = (whole.finished, whole.truncated, whole.error, whole.sequence, whole.events)
    assert verdict == (pieces.finished, pieces.truncated, pieces.error, pieces.sequence, pieces.events)
    assert whole_out == pieces_out
    assert whole.finished == (end in ("response.completed", "response.incomplete"))
    assert (whole.error is not None) == (end == "response.failed")
