"""The Anthropic Messages API as clients speak it: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Claude Code and the Anthropic SDKs speak only this. Errors are Anthropic's
``{"type": "error", "error": {"type", "message"}, "request_id"}`` with the error ``type`` of the status
(``authentication_error``, ``permission_error``, ``not_found_error``, ``rate_limit_error``,
``invalid_request_error``, ``overloaded_error``, ``api_error``); streams are SSE with ``event:`` lines, and a
stream that fails after it started ends with ``event: error``. ``stream`` defaults to false.

Each worker gets what it speaks:

* a worker that serves the Messages API itself (``native_apis: ["anthropic"]``: recent llama.cpp
  ``llama-server``, Ollama) takes the call unchanged (its stream is watched as Anthropic SSE);
* an OpenAI-style worker gets ``/v1/chat/completions`` (:class:`MessagesOnOpenAI`);
* an Ollama worker gets ``/api/chat`` (:class:`MessagesOnOllama`), which keeps more than Ollama's OpenAI
  routes: thinking both ways, ``top_k``, tool-call arguments as objects, tool names on tool results, images;

the request rules in :mod:`.prompt`, answers in :mod:`.answers`, streams in :mod:`.events`. ``count_tokens`` is
answered from the worker's tokenizer where it has one (:class:`CountOnOpenAI`: llama.cpp's and vLLM's
``/tokenize``, llama-cpp-python's ``/extras/tokenize``; Ollama has none), else from the gateway's estimate.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from turnout.dialects.anthropic import prompt
from turnout.dialects.anthropic.answers import message_from_ollama, message_from_openai
from turnout.dialects.anthropic.events import OllamaEvents, OpenAIEvents, error_event, error_type, sse_frame
from turnout.dialects.base import (
    JSON,
    Call,
    Counts,
    Dialect,
    Endpoint,
    Route,
    Timing,
    TokenCounter,
    Translation,
    TranslationError,
    WorkerAPI,
)
from turnout.dialects.streams import StreamKind, StreamWatch
from turnout.errors import TurnoutError

__all__ = [
    "API",
    "AnthropicAPI",
    "CountOnOllama",
    "CountOnOpenAI",
    "MessagesOnOllama",
    "MessagesOnOpenAI",
    "error_type",
]

NATIVE = "anthropic"  # the name of this API in a worker's native_apis


class AnthropicAPI:
    dialect: Dialect = Dialect.ANTHROPIC
    stream_kind: StreamKind = StreamKind.ANTHROPIC
    routes: tuple[Route, ...] = (
        Route("POST", "/v1/messages", Endpoint.MESSAGES),
        Route("POST", "/v1/messages/count_tokens", Endpoint.COUNT_TOKENS),
    )

    def stream_default(self, endpoint: Endpoint) -> bool:
        return False

    def model_field(self, endpoint: Endpoint, payload: JSON) -> tuple[str, object]:
        return "model", payload.get("model")

    def error_body(self, err: TurnoutError) -> bytes:
        return orjson.dumps(error_event(err))

    def error_frame(self, err: TurnoutError, watch: StreamWatch | None = None) -> bytes:
        return sse_frame(error_event(err))

    def error_in_dialect(self, body: JSON) -> bool:
        err = body.get("error")
        return body.get("type") == "error" and isinstance(err, dict) and isinstance(err.get("message"), str)

    def translation(
        self, worker: WorkerAPI, endpoint: Endpoint, native: frozenset[str]
    ) -> Translation | TokenCounter | None:
        ollama = worker is WorkerAPI.OLLAMA
        if endpoint is Endpoint.COUNT_TOKENS:
            # llama-server serves /v1/messages/count_tokens with its Messages API; Ollama serves only /v1/messages
            if NATIVE in native and not ollama:
                return None
            return COUNT_ON_OLLAMA if ollama else COUNT_ON_OPENAI
        if NATIVE in native:
            return None
        return ON_OLLAMA if ollama else ON_OPENAI

    def prompt_parts(self, call: Call) -> list[str]:
        """The prompt's parts in order as the worker sees them: system, tools, messages (prefix-aware routing)."""
        try:
            return prompt.prompt_parts(call.payload)
        except TranslationError:
            return []

    def session_key(self, call: Call, headers: Mapping[str, str]) -> str | None:
        """The session inside ``metadata.user_id``: Claude Code sends a JSON string with its ``session_id`` (the
        captures in tests/golden), earlier versions ``user_<hash>_account_<uuid>_session_<uuid>``; any other
        value is the client's own key as it is."""
        value = prompt.user_id(call.payload)
        if not value:
            return None
        if value.startswith("{"):
            try:
                parsed = orjson.loads(value)
            except orjson.JSONDecodeError:
                return value
            session = parsed.get("session_id") if isinstance(parsed, dict) else None
            return session if isinstance(session, str) and session else value
        _, marker, session = value.rpartition("_session_")
        return session if marker and session else value


def estimate(call: Call) -> int:
    """The gateway's prompt estimate, as the call is billed when the worker counts none (accounting decides it:
    :attr:`~turnout.dialects.base.Call.estimate`)."""
    return call.estimate


def _stops(call: Call) -> list[str]:
    stops = call.payload.get("stop_sequences")
    return [s for s in stops if isinstance(s, str) and s] if isinstance(stops, list) else []


class MessagesOnOpenAI:
    """A Messages call on an OpenAI-style worker: ``/v1/chat/completions``, its answer and SSE stream back as a
    Message and a Messages stream. The request first carries ``top_k``, ``reasoning_effort`` and
    ``chat_template_kwargs`` when the client asked for what they mean, and ``tool_choice: "required"`` for
    Anthropic's ``any``; a worker that refuses that form (OpenAI's own API refuses the fields,
    llama-cpp-python's server answers ``required`` with a 500) gets the request once more in the plainest form
    (:func:`.prompt.openai_alternate`), and that form from then on."""

    worker_stream: StreamKind = StreamKind.SSE
    content_type: str = "text/event-stream"

    def request(self, call: Call, model: str) -> tuple[str, JSON]:
        return "/v1/chat/completions", prompt.openai_request(call.payload, model, stream=call.stream)

    def alternate(self, request: JSON) -> JSON | None:
        return prompt.openai_alternate(request)

    def headers(self, call: Call) -> dict[str, str]:
        return {}

    def answer(self, call: Call, answer: JSON, timing: Timing) -> tuple[JSON, Counts]:
        return message_from_openai(answer, call.model, _stops(call), estimate(call), timing)

    def stream(self, call: Call) -> OpenAIEvents:
        return OpenAIEvents(call.model, _stops(call), estimate(call))

    def frame(self, obj: JSON) -> bytes:
        return sse_frame(obj)


class MessagesOnOllama:
    """A Messages call on an Ollama worker: ``/api/chat``, its answer and NDJSON stream back."""

    worker_stream: StreamKind = StreamKind.NDJSON
    content_type: str = "text/event-stream"

    def request(self, call: Call, model: str) -> tuple[str, JSON]:
        return "/api/chat", prompt.ollama_request(call.payload, model, stream=call.stream)

    def alternate(self, request: JSON) -> JSON | None:
        return None

    def headers(self, call: Call) -> dict[str, str]:
        return {}

    def answer(self, call: Call, answer: JSON, timing: Timing) -> tuple[JSON, Counts]:
        return message_from_ollama(answer, call.model, estimate(call), timing)

    def stream(self, call: Call) -> OllamaEvents:
        return OllamaEvents(call.model, estimate(call))

    def frame(self, obj: JSON) -> bytes:
        return sse_frame(obj)


def _prompt_text(call: Call) -> str:
    return "\n".join(prompt.prompt_parts(call.payload))


class CountOnOpenAI:
    """``count_tokens`` on an OpenAI-style worker: the prompt's text (:func:`.prompt.prompt_parts`) through the
    worker's tokenizer, ``/tokenize`` (llama.cpp's ``llama-server`` reads ``content``, vLLM ``prompt``) and then
    ``/extras/tokenize`` (llama-cpp-python's server). The chat template's own tokens are not in the count."""

    def tokenize(self, call: Call, model: str) -> list[tuple[str, JSON]]:
        text = _prompt_text(call)
        return [
            ("/tokenize", {"model": model, "content": text, "prompt": text, "add_special": True}),
            ("/extras/tokenize", {"model": model, "input": text}),
        ]

    def count(self, answer: JSON) -> int | None:
        count = answer.get("count")
        if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
            return count
        tokens = answer.get("tokens")
        return len(tokens) if isinstance(tokens, list) else None

    def answer(self, call: Call, tokens: int | None) -> JSON:
        if tokens is None:
            tokens = max(1, len(_prompt_text(call).encode()) // 4)
        return {"input_tokens": tokens}


class CountOnOllama(CountOnOpenAI):
    """``count_tokens`` on an Ollama worker: Ollama has no tokenizer route, so the gateway's estimate."""

    def tokenize(self, call: Call, model: str) -> list[tuple[str, JSON]]:
        prompt.read_prompt(call.payload)  # a bad request is a 400 all the same
        return []


API = AnthropicAPI()
ON_OPENAI = MessagesOnOpenAI()
ON_OLLAMA = MessagesOnOllama()
COUNT_ON_OPENAI = CountOnOpenAI()
COUNT_ON_OLLAMA = CountOnOllama()
