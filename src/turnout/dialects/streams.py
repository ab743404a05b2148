"""Stream frames: splitting a worker's byte stream into lines and frames, and deciding how it ended.

Pure and incremental: the proxy feeds body chunks as they arrive and forwards what :meth:`StreamWatch.feed`
returns. Whether a stream ended properly is decided by parsing frames, never by looking for substrings:

* SSE (OpenAI dialect): events are ``data:`` lines up to a blank line (the SSE spec's dispatch). The
  model finished when every choice that appeared carried a non-null ``finish_reason``; ``data: [DONE]`` is
  the terminator. A ``[DONE]`` before the finish (``llama_cpp.server`` sends one when it interrupts a
  stream for a waiting request, see its ``server/app.py`` ``get_event_publisher``) is *not* a normal end.
* NDJSON (Ollama dialect): one JSON object a line; the final object carries ``"done": true``.
* Responses SSE (the OpenAI Responses API): SSE events (``event:`` and ``data:`` lines) whose data object names
  its ``type``; exactly one terminal event ends the stream: ``response.completed`` or ``response.incomplete`` (the
  model's finish: its ``response`` holds the whole answer and its usage) or ``response.failed`` (the worker's own
  error). An ``error`` event is forwarded and the stream goes on to its terminal event; a close, or a ``[DONE]``,
  before one is a cut-short stream. The last ``sequence_number`` and the ``response`` of ``response.created`` are
  kept, so that a stream the gateway has to end itself goes on numbering its events.
* Any: an object with a top-level ``error`` (and no ``done: true``, ``choices`` or ``type``) is the worker's own
  error frame.
* Anthropic SSE (the Messages API, from a worker that serves it natively): ``event:`` + ``data:`` events. The
  model finished with a ``message_delta`` carrying a ``stop_reason``; ``message_stop`` is the terminator (a
  worker that closes after the finish without it gets one added: :attr:`StreamWatch.tail`); ``event: error``
  is the worker's own error frame. Usage (``input_tokens`` and the cache counters, ``output_tokens``) is kept
  under OpenAI's names in :attr:`StreamWatch.usage`.

Only whole lines (SSE: whole events) are forwarded, so a worker that dies mid-line never leaves half a
frame in the client's stream, and the gateway's error frame always starts on a line of its own.
Line buffering is linear in the stream's size and bounded: a line longer than ``max_line`` bytes ends the
stream (:class:`FrameError`).

Used by :mod:`turnout.gateway.proxy` for pass-through and translated streams.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

__all__ = [
    "MAX_LINE",
    "SSE_COMMENT",
    "FrameError",
    "LineSplitter",
    "StreamKind",
    "StreamWatch",
    "held_keepalive",
    "keepalive",
    "parse_object",
]

MAX_LINE = 4 << 20  # bytes; one SSE/NDJSON line longer than this ends the stream with an error frame
_DONE = b"[DONE]"
_SSE_FIELDS = (b":", b"event:", b"id:", b"retry:")  # with data:, every line an SSE stream may carry


class FrameError(ValueError):
    """The stream cannot be framed (a line too long, a frame that is not a JSON object)."""


def parse_object(data: bytes | str) -> dict[str, Any]:
    """Decode one JSON object, or raise :class:`FrameError` saying what it was instead."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise FrameError("not valid JSON") from None
    if not isinstance(value, dict):
        raise FrameError(f"a JSON {type(value).__name__}, expected an object")
    return value


class LineSplitter:
    """Incremental line splitting. Each byte is copied a bounded number of times, whatever the line sizes."""

    __slots__ = ("_max", "_parts", "_size")

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._max = max_line
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines completed by ``chunk``, without their ``\\n`` or ``\\r\\n``."""
        lines: list[bytes] = []
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                break
            piece = chunk[start:nl]
            if self._parts:
                self._parts.append(piece)
                piece = b"".join(self._parts)  # once per line: linear
                self._parts.clear()
                self._size = 0
            if len(piece) > self._max:
                raise FrameError(f"a stream line is longer than {self._max} bytes")
            lines.append(piece[:-1] if piece.endswith(b"\r") else piece)
            start = nl + 1
        if start < len(chunk):
            rest = chunk[start:] if start else chunk
            self._parts.append(rest)
            self._size += len(rest)
            if self._size > self._max:
                raise FrameError(f"a stream line is longer than {self._max} bytes")
        return lines

    @property
    def pending(self) -> int:
        """Bytes of an unfinished line held back."""
        return self._size


class StreamKind(StrEnum):
    SSE = "sse"
    NDJSON = "ndjson"
    RESPONSES = "responses"  # SSE events of the OpenAI Responses API
    ANTHROPIC = "anthropic"  # SSE with event: lines, as the Anthropic Messages API frames it


# Responses events that end a stream: the model's finish (its answer complete), or the worker's failure
_RESPONSES_FINISH = frozenset({"response.completed", "response.incomplete"})
_RESPONSES_FAILED = "response.failed"


# Stream kinds whose events carry an ``event:`` line besides their ``data:`` line.
_EVENT_LINES = frozenset({StreamKind.ANTHROPIC, StreamKind.RESPONSES})
# Anthropic's keep-alive event and last event (a Messages stream ends with it).
ANTHROPIC_PING = b'event: ping\ndata: {"type":"ping"}\n\n'
ANTHROPIC_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


# An SSE comment: a line that begins with a colon, which every event-stream parser skips (WHATWG HTML, "Server-sent
# events", interpreting an event stream; the OpenAI and Anthropic SDKs' decoders, Codex's eventsource parser).
SSE_COMMENT = b": keep-alive\n\n"


def keepalive(kind: StreamKind) -> bytes | None:
    """What a client's stream of this kind is sent while the worker is silent (None: nothing)."""
    return ANTHROPIC_PING if kind is StreamKind.ANTHROPIC else None


def held_keepalive(kind: StreamKind) -> bytes | None:
    """What a client's stream of this kind is sent while its request is held, before any event of its answer
    (:mod:`turnout.gateway.held_stream`): Anthropic's ``ping`` event, an SSE comment for the other SSE kinds; None for
    NDJSON, which has no line a client skips (Ollama's Go client, api/client.go ``stream``, and ollama-python,
    ``_client.py``, decode every line as JSON and fail on an empty one)."""
    if kind is StreamKind.NDJSON:
        return None
    return ANTHROPIC_PING if kind is StreamKind.ANTHROPIC else SSE_COMMENT


@dataclass(slots=True)
class StreamWatch:
    """Frames one worker stream and records how it ended. ``collect``: keep decoded frames in ``frames``
    for a translator to drain; the translator then decides whether the model finished (an OpenAI SSE stream's
    choices are not followed here: ``finished``, ``usage`` and ``events`` stay unset)."""

    kind: StreamKind
    collect: bool = False
    max_line: int = MAX_LINE
    ended: bool = False  # a terminal frame was seen: nothing after it is read or forwarded
    finished: bool = False  # the model's own finish (finish_reason / done: true) was seen
    error: str | None = None  # the worker's own error frame, if it sent one
    usage: dict[str, Any] | None = None  # the last OpenAI usage object (Responses: its counts under these names)
    timings: dict[str, Any] | None = None  # llama.cpp's server's ``timings`` (in its frames that finish a choice)
    final: dict[str, Any] | None = None  # Ollama's final ``done: true`` object; the Responses terminal event
    sequence: int = -1  # Responses: the last event's sequence_number
    response: dict[str, Any] | None = None  # Responses: the response of response.created (its id, model...)
    events: int = 0  # content frames (a stand-in for the token count when the worker reports none)
    tail: bytes = b""  # what the client's stream still needs after the worker closed it (a missing terminator)
    frames: list[dict[str, Any]] = field(default_factory=list)
    _lines: LineSplitter = field(init=False)
    _event: list[bytes] = field(default_factory=list)  # raw lines of the SSE event being read
    _data: list[bytes] = field(default_factory=list)  # its data fields
    _open: set[int] = field(default_factory=set)  # choice indices seen without a finish_reason yet
    _closed: set[int] = field(default_factory=set)
    _counted: dict[str, int] = field(default_factory=dict)  # Anthropic usage counters seen so far

    def __post_init__(self) -> None:
        self._lines = LineSplitter(self.max_line)

    @property
    def truncated(self) -> bool:
        """Ended (terminator or close) without the model's finish and without an error frame of its own."""
        return not self.finished and self.error is None

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to forward now (whole lines/events only). Raises :class:`FrameError` on a bad frame."""
        if self.ended:
            return b""
        if not self._lines.pending and not self._event:
            # One whole SSE event and nothing pending: the usual chunk of a token stream, dispatched without
            # the line splitter (the event is parsed all the same, once).
            if (
                self.kind is StreamKind.SSE
                and chunk[:6] == b"data: "
                and chunk[-2:] == b"\n\n"
                and chunk.count(b"\n") == 2
                and b"\r" not in chunk
                and len(chunk) <= self.max_line
            ):
                if self._dispatch(chunk[6:-2]) or self.finished or self.error is not None:
                    return chunk
                return b""  # an early [DONE]: withheld
            fast = self._feed_whole(chunk)
            if fast is not None:
                return fast
        out: list[bytes] = []
        for line in self._lines.feed(chunk):
            if self.kind is StreamKind.NDJSON:
                self._ndjson_line(line, out)
            else:
                self._sse_line(line, out)
            if self.ended:
                break
        return b"".join(out)

    def _feed_whole(self, chunk: bytes) -> bytes | None:
        """The common case, a chunk of whole frames and nothing pending: each frame is parsed exactly as
        the line path would, but the chunk is forwarded as it came. None: take the line path instead."""
        if b"\r" in chunk or len(chunk) > self.max_line or self.kind in _EVENT_LINES:
            return None  # Anthropic and Responses events carry an event: line: taken line by line
        if self.kind is StreamKind.SSE:
            if not chunk.endswith(b"\n\n"):
                return None
            if not chunk.startswith(b"data: "):
                return None
            payloads = chunk[6:-2].split(b"\n\ndata: ")
            # every event one "data: " line (checked at C speed): the separators and the final blank line are
            # all the newlines there are, so no payload holds one
            if chunk.count(b"\n") != 2 * len(payloads):
                return None
            dispatch = self._dispatch
            for n, payload in enumerate(payloads):
                if not dispatch(payload):
                    kept = n + 1 if self.finished or self.error is not None else n  # an early [DONE] is withheld
                    return b"".join(b"data: " + p + b"\n\n" for p in payloads[:kept])
            return chunk
        if not chunk.endswith(b"\n") or b"\n\n" in chunk:
            return None
        lines = chunk[:-1].split(b"\n")
        for n, line in enumerate(lines):
            self._ndjson_line(line, None)
            if self.ended:
                return b"".join(x + b"\n" for x in lines[: n + 1])
        return chunk

    # -- NDJSON ------------------------------------------------------------------------------------
    def _ndjson_line(self, line: bytes, out: list[bytes] | None) -> None:
        if not line.strip():
            return
        obj = _frame(line)
        if out is not None:
            out.append(line + b"\n")
        if obj.get("done") is True:
            self.final = obj
            self.finished = self.ended = True
        elif "error" in obj:
            self.error = _message(obj["error"])
            self.ended = True
        else:
            self.events += 1
        if self.collect:
            self.frames.append(obj)

    # -- SSE ---------------------------------------------------------------------------------------
    def _sse_line(self, line: bytes, out: list[bytes]) -> None:
        if line:
            if line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            elif not line.startswith(_SSE_FIELDS):
                raise FrameError(f"the worker sent a line that is not an SSE field: {line[:40]!r}")
            self._event.append(line)
            return
        raw, data = self._event, self._data  # a blank line dispatches the event
        self._event, self._data = [], []
        if not data:
            if raw:  # comments and fields without data: forwarded as they came
                out.append(b"\n".join(raw) + b"\n\n")
            return
        payload = data[0] if len(data) == 1 else b"\n".join(data)
        kind = self.kind
        if kind is StreamKind.SSE:
            dispatch = self._dispatch
        else:
            dispatch = self._anthropic if kind is StreamKind.ANTHROPIC else self._responses_event
        if dispatch(payload) or self.finished or self.error is not None:
            out.append(b"\n".join(raw) + b"\n\n")

    def _responses_event(self, payload: bytes) -> bool:
        """One Responses event (see the module's docstring)."""
        if payload.strip() == _DONE:  # not a Responses frame; before a terminal event it cuts the stream short
            self.ended = True
            return False
        obj = _frame(payload)
        kind = obj.get("type")
        sequence = obj.get("sequence_number")
        if type(sequence) is int and sequence > self.sequence:
            self.sequence = sequence
        if self.collect:
            self.frames.append(obj)
        if not isinstance(kind, str):
            if "error" in obj:  # an OpenAI error object instead of an event
                self.error = _message(obj["error"])
                self.ended = True
                return False
            return True
        if kind.endswith(".delta"):
            self.events += 1
            return True
        response = obj.get("response")
        if kind in _RESPONSES_FINISH or kind == _RESPONSES_FAILED:
            self.final = obj
            self.ended = True
            answer = response if isinstance(response, dict) else {}
            if kind == _RESPONSES_FAILED:
                self.error = _message(answer.get("error"))
                return False
            self.finished = True
            usage = answer.get("usage")
            if isinstance(usage, dict):
                self.usage = {
                    "prompt_tokens": usage.get("input_tokens"),
                    "completion_tokens": usage.get("output_tokens"),
                }
            return False
        if self.response is None and isinstance(response, dict):
            self.response = response
        return True

    def _anthropic(self, payload: bytes) -> bool:
        """Apply one Anthropic SSE event (by its data's ``type``; the ``event:`` line repeats it). False when it
        ended the stream: ``message_stop`` (the model's finish) or an ``error`` event (the worker's error)."""
        obj = _frame(payload)
        kind = obj.get("type")
        if kind == "content_block_delta":
            self.events += 1
        elif kind == "message_start":
            message = obj.get("message")
            self._count_anthropic(message.get("usage") if isinstance(message, dict) else None)
        elif kind == "message_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason") not in (None, ""):
                self.finished = True
            self._count_anthropic(obj.get("usage"))
        elif kind == "message_stop":
            self.finished = self.ended = True
            return False
        elif kind == "error":
            self.error = _message(obj.get("error"))
            self.ended = True
            return False
        if self.collect:
            self.frames.append(obj)
        return True

    def _count_anthropic(self, usage: object) -> None:
        """Anthropic's counters (cumulative in each event that has them) as OpenAI's ``usage``: the prompt is
        ``input_tokens`` plus the cache reads and writes, which Anthropic counts apart."""
        if not isinstance(usage, dict):
            return
        for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"):
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                self._counted[name] = value
        counted = self._counted
        prompt = [
            counted[n]
            for n in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
            if n in counted
        ]
        self.usage = {
            **({"prompt_tokens": sum(prompt)} if prompt else {}),
            **({"completion_tokens": counted["output_tokens"]} if "output_tokens" in counted else {}),
        }

    def _dispatch(self, payload: bytes) -> bool:
        """Apply one SSE event's data. False when it ended the stream (``finished`` then says whether it is
        forwarded: an early ``[DONE]`` is withheld, the caller ends the stream with an error frame)."""
        if payload[:1] == b"{":  # the usual frame: decoded here, and a JSON text that starts so is an object
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                raise FrameError("the worker sent a stream frame that is not valid JSON") from None
        elif payload.strip() == _DONE:
            self.ended = True
            self.finished = self._finished_all()
            return False
        else:
            obj = _frame(payload)
        if "error" in obj and "choices" not in obj:
            self.error = _message(obj["error"])
            self.ended = True
            return False
        if self.collect:  # a translator takes the frames and decides when the model finished
            self.frames.append(obj)
            if "timings" in obj:
                self._timings(obj)
            return True
        choices = obj.get("choices")
        first = choices[0] if type(choices) is list and len(choices) == 1 else None
        if type(first) is dict and not self._closed and first.get("index", 0) == 0:
            # one choice, index 0, none finished yet: the usual token frame, decided without the general walk
            self.events += 1
            if first.get("finish_reason") in (None, ""):
                self._open.add(0)
            else:
                self._closed.add(0)
                self._open.discard(0)
                self.finished = not self._open
                self._timings(obj)
        else:
            self._observe_choices(obj)
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
            self._timings(obj)
        return True

    def _timings(self, obj: dict[str, Any]) -> None:
        """llama.cpp's server adds ``timings`` to the frame that finishes the answer (and to the usage frame): read
        there only, not on every token's frame."""
        timings = obj.get("timings")
        if isinstance(timings, dict):
            self.timings = timings

    def _observe_choices(self, obj: dict[str, Any]) -> None:
        choices = obj.get("choices")
        if type(choices) is not list or not choices:
            return
        content = False
        for position, choice in enumerate(choices):
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", position)
            index = index if isinstance(index, int) else position
            if choice.get("finish_reason") not in (None, ""):
                self._closed.add(index)
                self._open.discard(index)
            elif index not in self._closed:
                self._open.add(index)
            content = True
        if content:
            self.events += 1
        if self._closed and not self._open:
            self.finished = True

    def _finished_all(self) -> bool:
        return bool(self._closed) and not self._open

    def close(self) -> None:
        """The worker closed the body. A stream whose model finished is complete even without ``[DONE]`` (or
        Anthropic's ``message_stop``, which the client is then sent in :attr:`tail`)."""
        if not self.ended:
            if self.kind is StreamKind.SSE and self._finished_all():
                self.finished = True
            elif self.kind is StreamKind.ANTHROPIC and self.finished:
                self.tail = ANTHROPIC_STOP
        self.ended = True


def _frame(data: bytes) -> dict[str, Any]:
    try:
        return parse_object(data)
    except FrameError as exc:
        raise FrameError(f"the worker sent a stream frame that is {exc}") from None


def _message(error: object) -> str:
    message = error.get("message") if isinstance(error, dict) else None
    if isinstance(message, str):
        return message
    if isinstance(error, str):
        return error
    return "the worker reported an error"
