"""The Ollama API as clients speak it: ``/api/chat``, ``/api/generate``, ``/api/embed``, ``/api/embeddings``,
``/api/show``.

Errors are Ollama's ``{"error": "..."}``; streams are NDJSON (one JSON object a line, the last ``done: true``), and
``stream`` defaults to true for chat and generate, as Ollama's server does (``api/types.go``). ``/api/show`` also
takes the model as ``name`` (older clients).

An Ollama worker takes these requests as they are. An OpenAI-style worker (llama.cpp, vLLM, SGLang, LM Studio,
mlx_lm) gets them translated (:class:`OllamaOnOpenAI`, rules in :mod:`.translate`), answers and streams included.

For prefix routing, a chat's prompt is its leading system messages, its tools, then its other messages; a
generate's its ``system`` then its ``prompt`` (a ``raw`` one: the prompt alone); an embedding has none. Ollama's
API has no field naming a session: only the operator's header (``routing.session_header``) names one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from turnout.dialects.base import (
    JSON,
    Call,
    Counts,
    Dialect,
    Endpoint,
    Route,
    Timing,
    Translation,
    WorkerAPI,
)
from turnout.dialects.ollama import translate
from turnout.dialects.parts import chat_parts, stable_text
from turnout.dialects.readable import check_chunks
from turnout.dialects.streams import StreamKind, StreamWatch
from turnout.errors import TurnoutError

__all__ = ["API", "OllamaAPI", "OllamaOnOpenAI"]

_TRANSLATED = (Endpoint.CHAT, Endpoint.GENERATE, Endpoint.EMBED, Endpoint.EMBED_LEGACY)
_NO_HEADERS: dict[str, str] = {}
# What Ollama's templates render of a message besides its role and content.
_MESSAGE_EXTRA = ("images", "tool_calls", "tool_name")


class OllamaAPI:
    dialect: Dialect = Dialect.OLLAMA
    stream_kind: StreamKind = StreamKind.NDJSON
    routes: tuple[Route, ...] = (
        Route("POST", "/api/chat", Endpoint.CHAT),
        Route("POST", "/api/generate", Endpoint.GENERATE),
        Route("POST", "/api/embed", Endpoint.EMBED),
        Route("POST", "/api/embeddings", Endpoint.EMBED_LEGACY),
        Route("POST", "/api/show", Endpoint.SHOW),
    )

    def stream_default(self, endpoint: Endpoint) -> bool:
        return endpoint in (Endpoint.CHAT, Endpoint.GENERATE)

    def model_field(self, endpoint: Endpoint, payload: JSON) -> tuple[str, object]:
        model = payload.get("model")
        if endpoint is Endpoint.SHOW and model is None:
            return "name", payload.get("name")  # older Ollama clients send "name"
        return "model", model

    def error_body(self, err: TurnoutError) -> bytes:
        return orjson.dumps({"error": err.message})

    def error_frame(self, err: TurnoutError, watch: StreamWatch | None = None) -> bytes:
        return self.error_body(err) + b"\n"

    def error_in_dialect(self, body: JSON) -> bool:
        return isinstance(body.get("error"), str)

    def translation(self, worker: WorkerAPI, endpoint: Endpoint, native: frozenset[str]) -> Translation | None:
        if worker is WorkerAPI.OPENAI and endpoint in _TRANSLATED:
            return ON_OPENAI
        return None

    def prompt_parts(self, call: Call) -> list[str]:
        payload = call.payload
        if call.endpoint is Endpoint.CHAT:
            return chat_parts(payload.get("messages"), payload.get("tools"), _MESSAGE_EXTRA)
        if call.endpoint is Endpoint.GENERATE:
            prompt = stable_text(payload.get("prompt", ""))
            system = payload.get("system")
            if payload.get("raw") or not system:
                return [prompt]
            return [stable_text(system), prompt]
        return []

    def session_key(self, call: Call, headers: Mapping[str, str]) -> str | None:
        return None


class OllamaOnOpenAI:
    """An Ollama client's call on an OpenAI-style worker: ``/api/chat`` and ``/api/generate`` become
    ``/v1/chat/completions`` (``raw`` prompts ``/v1/completions``), ``/api/embed(dings)`` ``/v1/embeddings``; the
    answers and SSE streams come back as Ollama's objects and NDJSON, with its timing stats."""

    worker_stream: StreamKind = StreamKind.SSE
    content_type: str = "application/x-ndjson"

    def request(self, call: Call, model: str) -> tuple[str, JSON]:
        payload = call.payload
        if call.endpoint is Endpoint.CHAT:
            return "/v1/chat/completions", translate.chat_to_openai(payload, model, stream=call.stream)
        if call.endpoint is Endpoint.GENERATE:
            return translate.generate_to_openai(payload, model, stream=call.stream)
        legacy = call.endpoint is Endpoint.EMBED_LEGACY
        return "/v1/embeddings", translate.embed_to_openai(payload, model, legacy=legacy)

    def alternate(self, request: JSON) -> JSON | None:
        return translate.schema_as_json_object(request)

    def headers(self, call: Call) -> dict[str, str]:
        return _NO_HEADERS

    def answer(self, call: Call, answer: JSON, timing: Timing) -> tuple[JSON, Counts]:
        reported = _obj(answer.get("usage"))
        if call.endpoint in (Endpoint.EMBED, Endpoint.EMBED_LEGACY):
            legacy = call.endpoint is Endpoint.EMBED_LEGACY
            out = translate.embed_from_openai(answer, call.model, timing, legacy=legacy, estimate=call.estimate)
            return out, Counts(_count(reported, "prompt_tokens"))
        generate = call.endpoint is Endpoint.GENERATE
        out = translate.chat_from_openai(
            answer, call.model, timing, generate=generate, completions=_raw(call), estimate=call.estimate
        )
        return out, _counts(out, reported)

    def stream(self, call: Call) -> _ChatStream:
        generate = call.endpoint is Endpoint.GENERATE
        translator = translate.ChatStreamTranslator(
            model=call.model, generate=generate, completions=_raw(call), estimate=call.estimate
        )
        return _ChatStream(translator)

    def frame(self, obj: JSON) -> bytes:
        return orjson.dumps(obj) + b"\n"


class _ChatStream:
    """A :class:`translate.ChatStreamTranslator` seen through :class:`~turnout.dialects.base.StreamTranslation`."""

    __slots__ = ("_translator",)

    def __init__(self, translator: translate.ChatStreamTranslator) -> None:
        self._translator = translator

    @property
    def finish_reason(self) -> object:
        return self._translator.finish_reason

    def feed(self, events: list[JSON], created_at: str) -> list[JSON]:
        translator = self._translator
        check_chunks(events, completions=translator.completions)  # a message that cannot be read: raised first
        feed = translator.feed
        if len(events) == 1:
            return feed(events[0], created_at)
        return [obj for event in events for obj in feed(event, created_at)]

    def finish(self, timing: Timing) -> tuple[list[JSON], Counts]:
        final = self._translator.finish(timing)
        return final, _counts(final[-1], self._translator.usage or {})

    def fail(self, err: TurnoutError) -> list[JSON]:
        return [{"error": err.message}]


def _raw(call: Call) -> bool:
    """A raw generate, which goes to ``/v1/completions`` (:func:`.translate.generate_to_openai`)."""
    return call.endpoint is Endpoint.GENERATE and bool(call.payload.get("raw"))


def _counts(final: JSON, reported: JSON) -> Counts:
    """The worker's own counts where it reported them; the decode time from the translated stats."""
    ns = _count(final, "eval_duration") or _count(final, "total_duration") or 0
    return Counts(_count(reported, "prompt_tokens"), _count(final, "eval_count"), ns / 1e9)


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(obj: dict[str, Any], key: str) -> int | None:
    """A non-negative integer field, or None (absent, wrong type, negative)."""
    value = obj.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


API = OllamaAPI()
ON_OPENAI = OllamaOnOpenAI()
