"""Worker streams as Anthropic Messages streams (pure; rules shared with whole answers in :mod:`.answers`).

A converter is fed the worker's decoded stream events as they arrive together (OpenAI SSE ``data:`` objects,
or Ollama's NDJSON objects) and returns the Messages events to send for them: ``message_start`` on the first
one; then ``content_block_start`` / ``content_block_delta`` (``thinking_delta``, ``text_delta``,
``input_json_delta``) / ``content_block_stop`` as the model writes; and once the worker's stream ended with the
model's finish, ``message_delta`` (``stop_reason``, ``stop_sequence``, usage) and ``message_stop``. Pieces of
text (or of thinking) that arrived together are one delta: fewer, larger frames when the worker outpaces the
gateway, and one frame a piece when it does not.

OpenAI-style workers stream a tool call's arguments in fragments, and may interleave two calls: each call is
gathered whole and sent at the end as one ``tool_use`` block whose ``input_json_delta`` is always one JSON object
(an SDK parses the concatenated fragments; a fragment of broken JSON would break the client's stream).
"""

from __future__ import annotations

from typing import Any

import orjson

from turnout.dialects.anthropic.answers import Usage, message_id, stop_reason, tool_input, tool_use_id
from turnout.dialects.base import Counts, Timing
from turnout.dialects.readable import check_chunks, chunk_choices, chunk_delta, ollama_message
from turnout.errors import TurnoutError

__all__ = ["OllamaEvents", "OpenAIEvents", "error_event", "error_type", "sse_frame"]

JSON = dict[str, Any]


_TYPES = (
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "ping",
    "error",
)
_HEADS = {name: f"event: {name}\ndata: ".encode() for name in _TYPES}


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
    504: "timeout_error",
}


def error_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status."""
    found = _ERROR_TYPES.get(status)
    if found is not None:
        return found
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def error_event(err: TurnoutError) -> JSON:
    """The Messages API's error object: an error answer's body, and the ``error`` event that ends a stream."""
    body: JSON = {"type": "error", "error": {"type": error_type(err.status), "message": err.message}}
    request_id = err.headers.get("request-id")
    if request_id:
        body["request_id"] = request_id
    return body


def sse_frame(event: JSON) -> bytes:
    """One Messages stream event: its ``event:`` line (the SDKs dispatch on it) and its ``data:``."""
    kind = event["type"]
    head = _HEADS.get(kind) or f"event: {kind}\ndata: ".encode()
    return head + orjson.dumps(event) + b"\n\n"


class _Message:
    """The message being streamed: its id, its open content block, and the events that open and close blocks."""

    __slots__ = ("blocks", "deltas", "id", "index", "kind", "last", "model", "pieces", "usage")

    def __init__(self, model: str, estimate: int) -> None:
        self.model = model
        self.usage = Usage(estimate)
        self.id = ""
        self.index = -1  # the last block's index
        self.kind: str | None = None  # the open block's type
        self.deltas = 0  # content pieces sent (the output count when the worker reports none)
        self.blocks = 0
        self.last: JSON | None = None  # the batch's last text or thinking delta, which more pieces join
        self.pieces: list[str] = []  # its pieces, joined by flush()

    def start(self, source: object) -> JSON:
        self.id = message_id(source)
        return {
            "type": "message_start",
            "message": {
                "id": self.id,
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": self.usage.anthropic(),
            },
        }

    def open(self, block: JSON, out: list[JSON]) -> None:
        self.close(out)
        self.index += 1
        self.kind = block["type"]
        out.append({"type": "content_block_start", "index": self.index, "content_block": block})

    def close(self, out: list[JSON]) -> None:
        if self.kind is not None:
            self.flush()
            out.append({"type": "content_block_stop", "index": self.index})
            self.kind = None

    def text(self, text: str, out: list[JSON]) -> None:
        if self.kind != "text":
            self.open({"type": "text", "text": ""}, out)
        self.piece("text_delta", "text", text, out)

    def thinking(self, text: str, out: list[JSON]) -> None:
        if self.kind != "thinking":
            self.open({"type": "thinking", "thinking": "", "signature": ""}, out)
        self.piece("thinking_delta", "thinking", text, out)

    def piece(self, kind: str, field: str, text: str, out: list[JSON]) -> None:
        """One more piece of the open block: it joins the last delta when that one is of this batch (``out``'s
        last event), else it starts a delta."""
        self.deltas += 1
        if out and out[-1] is self.last:
            self.pieces.append(text)
            return
        self.flush()
        event = {"type": "content_block_delta", "index": self.index, "delta": {"type": kind, field: text}}
        out.append(event)
        self.last, self.pieces = event, [text]

    def flush(self) -> None:
        """The last delta gets all its pieces (called before the batch's events are sent)."""
        last, pieces = self.last, self.pieces
        if last is not None and len(pieces) > 1:
            delta = last["delta"]
            delta["text" if delta["type"] == "text_delta" else "thinking"] = "".join(pieces)
        self.last, self.pieces = None, []

    def tool_use(self, worker_id: object, name: str, arguments: object, out: list[JSON]) -> None:
        call_id = tool_use_id(worker_id, self.id, self.blocks)
        self.blocks += 1
        self.open({"type": "tool_use", "id": call_id, "name": name, "input": {}}, out)
        partial = orjson.dumps(tool_input(arguments)).decode()
        out.append(
            {
                "type": "content_block_delta",
                "index": self.index,
                "delta": {"type": "input_json_delta", "partial_json": partial},
            }
        )
        self.close(out)

    def end(self, reason: str, matched: str | None, out: list[JSON]) -> None:
        self.close(out)
        out.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": matched},
                "usage": self.usage.anthropic(self.deltas),
            }
        )
        out.append({"type": "message_stop"})


class OpenAIEvents:
    """An OpenAI-style worker's ``/v1/chat/completions`` SSE events as a Messages stream."""

    __slots__ = ("_calls", "_matched", "_message", "_started", "_stops", "finish_reason")

    def __init__(self, model: str, stops: list[str], estimate: int) -> None:
        self._message = _Message(model, estimate)
        self._stops = stops
        self._started = False
        self._calls: dict[int, list[Any]] = {}  # index -> [id, name, argument fragments]
        self._matched: str | None = None
        self.finish_reason: str | None = None

    def feed(self, events: list[JSON], created_at: str) -> list[JSON]:
        check_chunks(events)  # an event whose message cannot be read raises before any of the batch is said
        out: list[JSON] = []
        message = self._message
        for event in events:
            choices = event.get("choices")
            # the usual event, one more piece of the text being written: {"choices": [{"delta": {"content": ..}}]}
            if message.kind == "text" and type(choices) is list and len(choices) == 1:
                choice = choices[0]
                if type(choice) is dict:
                    delta = choice.get("delta")
                    if type(delta) is dict and len(delta) == 1:
                        text = delta.get("content")
                        if type(text) is str and text and choice.get("finish_reason") is None and "usage" not in event:
                            message.piece("text_delta", "text", text, out)
                            continue
            self._event(event, choices, out)
        message.flush()
        return out

    def _event(self, event: JSON, choices: object, out: list[JSON]) -> None:
        message = self._message
        if not self._started:
            self._started = True
            out.append(message.start(event.get("id") or event))
        usage = event.get("usage")
        if usage is not None:
            message.usage.openai(usage)
        read = chunk_choices(event)
        if not read:
            return
        choice = read[0]
        delta = chunk_delta(choice)
        if delta is not None:
            thinking = delta.get("reasoning_content") or delta.get("reasoning")
            if thinking and type(thinking) is str:
                message.thinking(thinking, out)
            text = delta.get("content")
            if text and type(text) is str:
                message.text(text, out)
            calls = delta.get("tool_calls")
            if calls:
                self._gather(calls)
        reason = choice.get("finish_reason")
        if reason and type(reason) is str:
            self.finish_reason = reason
            matched = choice.get("stop_reason")
            if isinstance(matched, str) and matched in self._stops:
                self._matched = matched

    def _gather(self, calls: object) -> None:
        for position, call in enumerate(calls if isinstance(calls, list) else []):
            if not isinstance(call, dict):
                continue
            index = call.get("index")
            if not isinstance(index, int) or isinstance(index, bool):
                index = position
            slot = self._calls.setdefault(index, [None, "", []])
            if isinstance(call.get("id"), str) and slot[0] is None:
                slot[0] = call["id"]
            function = call.get("function")
            if isinstance(function, dict):
                name = function.get("name")
                if isinstance(name, str) and name and not slot[1]:
                    slot[1] = name
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    slot[2].append(arguments)

    def fail(self, err: TurnoutError) -> list[JSON]:
        """The stream's last event when it fails after it started: Anthropic's ``error`` event (the SDKs raise it)."""
        return [error_event(err)]

    def finish(self, timing: Timing) -> tuple[list[JSON], Counts]:
        out: list[JSON] = []
        message = self._message
        if not self._started:
            self._started = True
            out.append(message.start({}))
        calls = [self._calls[i] for i in sorted(self._calls) if self._calls[i][1]]
        for worker_id, name, fragments in calls:
            message.tool_use(worker_id, name, "".join(fragments), out)
        message.end(stop_reason(self.finish_reason, bool(calls), self._matched), self._matched, out)
        seconds = max(timing.total_ns - timing.first_token_ns, 0) / 1e9
        return out, message.usage.counts(message.deltas, seconds)


class OllamaEvents:
    """An Ollama worker's ``/api/chat`` NDJSON stream as a Messages stream: thinking, text, whole tool calls."""

    __slots__ = ("_final", "_message", "_started", "_tools", "finish_reason")

    def __init__(self, model: str, estimate: int) -> None:
        self._message = _Message(model, estimate)
        self._started = False
        self._tools = False
        self._final: JSON = {}
        self.finish_reason: str | None = None

    def feed(self, events: list[JSON], created_at: str) -> list[JSON]:
        check_chunks(events, ollama=True)  # an object without a message raises before any of the batch is said
        out: list[JSON] = []
        for event in events:
            self._event(event, out)
        self._message.flush()
        return out

    def _event(self, event: JSON, out: list[JSON]) -> None:
        message = self._message
        if not self._started:
            self._started = True
            out.append(message.start(event))
        part = ollama_message(event, chunk=True)
        if part is not None:
            thinking = part.get("thinking")
            if thinking and isinstance(thinking, str):
                message.thinking(thinking, out)
            text = part.get("content")
            if text and isinstance(text, str):
                message.text(text, out)
            calls = part.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"]:
                    self._tools = True
                    message.tool_use(call.get("id"), function["name"], function.get("arguments"), out)
        if event.get("done") is True:
            self._final = event
            reason = event.get("done_reason")
            self.finish_reason = reason if isinstance(reason, str) and reason else "stop"

    def fail(self, err: TurnoutError) -> list[JSON]:
        """The stream's last event when it fails after it started: Anthropic's ``error`` event (the SDKs raise it)."""
        return [error_event(err)]

    def finish(self, timing: Timing) -> tuple[list[JSON], Counts]:
        out: list[JSON] = []
        message = self._message
        if not self._started:
            self._started = True
            out.append(message.start(self._final))
        message.usage.ollama(self._final)
        message.end(stop_reason(self.finish_reason, self._tools, None), None, out)
        duration = self._final.get("eval_duration")
        ns = duration if isinstance(duration, int) and not isinstance(duration, bool) and duration > 0 else 0
        seconds = (ns or max(timing.total_ns - timing.first_token_ns, 0)) / 1e9
        return out, message.usage.counts(message.deltas, seconds)
