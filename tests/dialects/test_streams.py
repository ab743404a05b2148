"""Stream framing: how a worker stream ended is decided by parsing frames, for every way of chunking it."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnout.dialects.streams import FrameError, LineSplitter, StreamKind, StreamWatch


def sse(*objs: object) -> bytes:
    return b"".join(b"data: " + (o if isinstance(o, bytes) else orjson.dumps(o)) + b"\n\n" for o in objs)


def chunk(text: str, finish: str | None = None, index: int = 0) -> dict[str, object]:
    return {"choices": [{"index": index, "delta": {"content": text}, "finish_reason": finish}]}


FINISHED = sse(chunk("a"), chunk("b", "stop"), b"[DONE]")
OLLAMA_DONE = b'{"message":{"content":"a"},"done":false}\n{"done":true,"eval_count":2,"prompt_eval_count":3}\n'


def run(kind: StreamKind, data: bytes, cuts: list[int] | None = None) -> tuple[StreamWatch, bytes]:
    watch = StreamWatch(kind)
    out = b""
    points = sorted(set(cuts or []))
    start = 0
    for cut in [*points, len(data)]:
        piece = data[start:cut]
        start = cut
        if piece:
            out += watch.feed(piece)
    if not watch.ended:
        watch.close()
    return watch, out


@pytest.mark.parametrize(
    ("kind", "data", "finished", "truncated", "error"),
    [
        (StreamKind.SSE, FINISHED, True, False, None),
        # the model finished; the worker closed without [DONE]: complete
        (StreamKind.SSE, sse(chunk("a"), chunk("b", "length")), True, False, None),
        # llama_cpp.server's interrupt: [DONE] before any finish_reason
        (StreamKind.SSE, sse(chunk("a"), b"[DONE]"), False, True, None),
        # content that contains the terminator and the word error is just content
        (StreamKind.SSE, sse(chunk("data: [DONE]"), chunk('"error": 1')), False, True, None),
        (StreamKind.SSE, sse(chunk("a"), {"error": {"message": "boom"}}), False, False, "boom"),
        (StreamKind.SSE, sse(chunk("a"), chunk("b")), False, True, None),
        # n=2: both choices must finish
        (StreamKind.SSE, sse(chunk("a", index=0), chunk("b", "stop", 1), b"[DONE]"), False, True, None),
        (StreamKind.SSE, sse(chunk("a", "stop", 0), chunk("b", "stop", 1), b"[DONE]"), True, False, None),
        (StreamKind.NDJSON, OLLAMA_DONE, True, False, None),
        (StreamKind.NDJSON, b'{"message":{"content":"done: true, error"},"done":false}\n', False, True, None),
        (
            StreamKind.NDJSON,
            b'{"message":{"content":"a"},"done":false}\n{"error":"out of memory"}\n',
            False,
            False,
            "out of memory",
        ),
        (StreamKind.NDJSON, b'{"message":{"content":"a"},"done":false}\n{"done":tr', False, True, None),
    ],
)
def test_how_streams_end(kind: StreamKind, data: bytes, finished: bool, truncated: bool, error: str | None) -> None:
    watch, _ = run(kind, data)
    assert (watch.finished, watch.truncated, watch.error) == (finished, truncated, error)


def test_early_done_is_withheld_and_partial_lines_never_forwarded() -> None:
    _, out = run(StreamKind.SSE, sse(chunk("a"), b"[DONE]"))
    assert b"[DONE]" not in out and out == sse(chunk("a"))
    _, out = run(StreamKind.NDJSON, b'{"done":false}\n{"done":tr')
    assert out == b'{"done":false}\n'


def test_nothing_after_the_terminal_frame_is_forwarded() -> None:
    watch, out = run(StreamKind.SSE, FINISHED + sse(chunk("late")))
    assert watch.finished and out == FINISHED


def test_usage_and_events() -> None:
    data = sse(chunk("a"), chunk("b", "stop"), {"choices": [], "usage": {"prompt_tokens": 3}}, b"[DONE]")
    watch, _ = run(StreamKind.SSE, data)
    assert watch.usage == {"prompt_tokens": 3} and watch.events == 2


@pytest.mark.parametrize(
    "frame", [b"data: not json\n\n", b"data: [1,2]\n\n", b"data: \xff\xfe\n\n", b"5\n", b"[]\n", b"nul\n"]
)
def test_a_frame_that_is_not_an_object_is_an_error(frame: bytes) -> None:
    kind = StreamKind.SSE if frame.startswith(b"data") else StreamKind.NDJSON
    with pytest.raises(FrameError, match="stream frame"):
        StreamWatch(kind).feed(frame)


def test_a_line_past_the_bound_is_an_error() -> None:
    watch = StreamWatch(StreamKind.NDJSON, max_line=1000)
    watch.feed(b"x" * 600)
    with pytest.raises(FrameError, match="longer than 1000 bytes"):
        watch.feed(b"x" * 600)


def test_line_buffering_is_linear() -> None:
    """One 4 MiB line in 64 KiB chunks: pieces are kept as they came (no re-copy per chunk) and joined once."""
    splitter = LineSplitter(max_line=8 << 20)
    part = b"y" * 65536
    for n in range(1, 65):
        assert splitter.feed(part) == []
        assert splitter.pending == n * len(part)
        assert len(splitter._parts) == n and all(p is part for p in splitter._parts)  # held, not concatenated
    assert splitter.feed(b"\n") == [b"y" * (64 * 65536)]
    assert splitter.pending == 0 and splitter._parts == []


comments = st.sampled_from([b": keep-alive\n\n", b"event: message\n"])


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(st.text(max_size=20), max_size=8),
    finish=st.sampled_from([None, "stop", "length"]),
    done=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12),
    crlf=st.booleans(),
)
def test_chunking_never_changes_the_verdict(
    texts: list[str], finish: str | None, done: bool, cuts: list[int], crlf: bool
) -> None:
    frames: list[object] = [chunk(t) for t in texts]
    if finish:
        frames.append(chunk("", finish))
    if done:
        frames.append(b"[DONE]")
    data = sse(*frames)
    if crlf:
        data = data.replace(b"\n", b"\r\n")
    whole, whole_out = run(StreamKind.SSE, data)
    pieces, pieces_out = run(StreamKind.SSE, data, [c % (len(data) + 1) for c in cuts])
    assert (whole.finished, whole.truncated, whole.events) == (pieces.finished, pieces.truncated, pieces.events)
    assert whole_out == pieces_out
    assert whole.finished == (finish is not None)
    # forwarded bytes are whole events that re-parse to the same content
    replay, _ = run(StreamKind.SSE, whole_out)
    assert replay.events == whole.events


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300), kind=st.sampled_from(list(StreamKind)))
def test_arbitrary_bytes_never_crash(data: bytes, kind: StreamKind) -> None:
    watch = StreamWatch(kind)
    try:
        out = watch.feed(data)
    except FrameError:
        return
    watch.close()
    assert out.endswith(b"\n") or out == b""
    assert watch.finished or watch.truncated or watch.error is not None


@pytest.mark.parametrize("line", [b"{}", b"hello", b"HTTP/1.1 200 OK"])
def test_sse_lines_must_be_sse_fields(line: bytes) -> None:
    with pytest.raises(FrameError, match="not an SSE field"):
        StreamWatch(StreamKind.SSE).feed(line + b"\n\n")


def test_sse_comments_are_forwarded() -> None:
    watch, out = run(StreamKind.SSE, b": ping\n\n" + FINISHED)
    assert watch.finished and out == b": ping\n\n" + FINISHED


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize(
    ("kind", "data", "expected"),
    [
        (
            StreamKind.SSE,
            sse(chunk("a"), {"error": {"message": "boom"}}, chunk("late")),
            sse(chunk("a"), {"error": {"message": "boom"}}),
        ),
        (StreamKind.SSE, sse(chunk("a"), b"[DONE]", chunk("late")), sse(chunk("a"))),
        (StreamKind.SSE, FINISHED + sse(chunk("late")), FINISHED),
        (StreamKind.NDJSON, b'{"done":false}\n{"error":"x"}\n{"done":false}\n', b'{"done":false}\n{"error":"x"}\n'),
    ],
)
def test_whole_chunks_and_line_by_line_forward_the_same(
    kind: StreamKind, data: bytes, expected: bytes, split: bool
) -> None:
    """The whole-frames fast path and the line path agree, the terminal frame included."""
    _, out = run(kind, data, list(range(1, len(data))) if split else [])
    assert out == expected
