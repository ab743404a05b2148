"""The OpenAI Responses API as clients speak it: ``POST /v1/responses`` (Codex CLI, the OpenAI Agents SDK, the
``openai`` SDK's ``responses.create``).

Errors are OpenAI's ``{"error": {"message", "type", "code"}}``; streams are Responses SSE (``event:`` and ``data:``
lines, every event with its ``sequence_number``, exactly one of ``response.completed`` / ``response.incomplete`` /
``response.failed`` at the end: a stream that fails after it started ends with ``response.failed``, numbered on
from the last event).

A worker that serves the API itself (``native_apis`` holds ``"responses"``: vLLM, Ollama, LM Studio) gets the call
as it is. Every other worker gets a Chat Completions request, ``/v1/chat/completions``: OpenAI-style servers, and
Ollama through its own OpenAI routes (the answer and the stream are turned back; rules in :mod:`.request`,
:mod:`.answer` and :mod:`.stream`). Stored responses (``store``, ``previous_response_id``, the ``GET`` and
``DELETE`` routes) are the gateway's (:mod:`turnout.gateway.stored`), not this module's: by the time a call gets
here its ``input`` holds the whole conversation and :attr:`~turnout.dialects.base.Call.answer_id` names the answer.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from turnout.dialects import openai
from turnout.dialects.base import (
    JSON,
    Call,
    Counts,
    Dialect,
    Endpoint,
    Route,
    Timing,
    Translation,
    TranslationError,
    WorkerAPI,
)
from turnout.dialects.ollama.translate import schema_as_json_object
from turnout.dialects.parts import chat_parts
from turnout.dialects.responses import answer as answers
from turnout.dialects.responses import request
from turnout.dialects.responses.stream import ResponsesStream, failed_response
from turnout.dialects.streams import StreamKind, StreamWatch
from turnout.errors import TurnoutError

__all__ = ["API", "ON_CHAT", "ResponsesAPI", "ResponsesOnChat"]

NATIVE = "responses"  # a worker's native_apis entry for this API


class ResponsesAPI:
    dialect: Dialect = Dialect.RESPONSES
    stream_kind: StreamKind = StreamKind.RESPONSES
    routes: tuple[Route, ...] = (Route("POST", "/v1/responses", Endpoint.RESPONSES),)

    def stream_default(self, endpoint: Endpoint) -> bool:
        return False

    def model_field(self, endpoint: Endpoint, payload: JSON) -> tuple[str, object]:
        return "model", payload.get("model")

    def error_body(self, err: TurnoutError) -> bytes:
        return openai.error_body(err)

    def error_frame(self, err: TurnoutError, watch: StreamWatch | None = None) -> bytes:
        """``response.failed``, numbered on from the worker's last event, for the response it had started."""
        started = watch.response if watch is not None and watch.response is not None else {}
        head = {
            "id": started.get("id") if isinstance(started.get("id"), str) else "resp_failed",
            "object": "response",
            "created_at": started.get("created_at") if isinstance(started.get("created_at"), int | float) else 0,
            "model": started.get("model") if isinstance(started.get("model"), str) else "",
        }
        sequence = watch.sequence + 1 if watch is not None else 0
        event = {"type": "response.failed", "response": failed_response(head, err, []), "sequence_number": sequence}
        return frame(event)

    def error_in_dialect(self, body: JSON) -> bool:
        return openai.API.error_in_dialect(body)

    def translation(self, worker: WorkerAPI, endpoint: Endpoint, native: frozenset[str]) -> Translation | None:
        return None if NATIVE in native else ON_CHAT

    # -- for prefix-aware routing (issue 24) --------------------------------------------------------
    def prompt_parts(self, call: Call) -> list[str]:
        """The prompt's parts as the chat request it becomes gives them (the same parts as that chat request's, as
        the worker sees the same prompt). Empty when the request cannot be translated."""
        try:
            chat, _ = request.to_chat(call.payload, call.model, stream=False)
        except (TranslationError, TypeError, ValueError, RecursionError):
            return []
        return chat_parts(chat["messages"], chat.get("tools"), openai.MESSAGE_EXTRA)

    def session_key(self, call: Call, headers: Mapping[str, str]) -> str | None:
        """The client's own conversation key: ``prompt_cache_key`` (Codex sends its session id there)."""
        key = call.payload.get("prompt_cache_key")
        return key if isinstance(key, str) and key else None


class ResponsesOnChat:
    """A Responses call on a worker that speaks Chat Completions (see the module's docstring)."""

    worker_stream: StreamKind = StreamKind.SSE
    content_type: str = "text/event-stream"

    def request(self, call: Call, model: str) -> tuple[str, JSON]:
        body, _ = request.to_chat(call.payload, model, stream=call.stream)
        return "/v1/chat/completions", body

    def alternate(self, request: JSON) -> JSON | None:
        return schema_as_json_object(request)

    def headers(self, call: Call) -> dict[str, str]:
        dropped = request.dropped_tools(call.payload)
        return {request.HOSTED_TOOL_NOTE: ",".join(dropped)} if dropped else {}

    def answer(self, call: Call, answer: JSON, timing: Timing) -> tuple[JSON, Counts]:
        names = request.tool_names(call.payload)
        created = answers.epoch(timing.created_at)
        out, usage = answers.from_chat(
            answer, call.payload, names, _response_id(call), created, call.model, call.estimate
        )
        counts = Counts(
            _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")), timing.total_ns / 1e9
        )
        return out, counts

    def stream(self, call: Call) -> ResponsesStream:
        names = request.tool_names(call.payload)
        return ResponsesStream(call.payload, names, _response_id(call), call.model, call.estimate)

    def frame(self, obj: JSON) -> bytes:
        return frame(obj)


def frame(event: JSON) -> bytes:
    """One Responses SSE event: its type on an ``event:`` line, the object on a ``data:`` line."""
    kind = event.get("type")
    head = _HEADS.get(kind) if isinstance(kind, str) else b"data: "
    if head is None:
        head = b"event: " + str(kind).encode() + b"\ndata: "
    return head + orjson.dumps(event) + b"\n\n"


# The event types the translation writes, with the start of their frames (the usual ones made once)
_HEADS = {
    kind: b"event: " + kind.encode() + b"\ndata: "
    for kind in (
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_text.delta",
    )
}


def _response_id(call: Call) -> str:
    return call.answer_id or "resp_0"


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


API = ResponsesAPI()
ON_CHAT = ResponsesOnChat()
