"""The OpenAI API as clients speak it: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``.

Errors are OpenAI's ``{"error": {"message", "type", "code"}}``; streams are SSE (``data:`` events, ``data: [DONE]``).
Every worker takes these requests as they are: OpenAI-style servers natively, and Ollama through its own OpenAI
routes (``/v1/...``, ``server/routes.go``), so nothing is translated.

For prefix routing, a chat call's prompt is its leading system/developer messages, its tools, then its other
messages; a completion's its ``prompt``; an embedding has none. The session a client names is its
``prompt_cache_key`` (OpenAI's key for exactly this: requests sharing a prefix and a key go to the same cache),
else its ``user``.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from turnout.dialects.base import JSON, Call, Dialect, Endpoint, Route, Translation, WorkerAPI
from turnout.dialects.parts import chat_parts, stable_text, text_field
from turnout.dialects.streams import StreamKind, StreamWatch
from turnout.errors import TurnoutError

__all__ = ["API", "MESSAGE_EXTRA", "OpenAIChat", "error_body"]


def error_body(err: TurnoutError, *, field: bool = False) -> bytes:
    """OpenAI's error object (``param``: the bad field where one is named, else null, as OpenAI's); ``field``: with
    the bad field of a 422 (the admin API's form of it)."""
    bad = getattr(err, "field", None)
    body: dict[str, object] = {"message": err.message, "type": err.type, "param": bad, "code": err.code}
    if field and bad:  # a 422's field, for the admin UI to show the message next to it
        body["field"] = bad
    return orjson.dumps({"error": body})


# What chat templates render of a message besides its role and content.
MESSAGE_EXTRA = ("name", "tool_calls", "tool_call_id")  # what a chat template renders besides role, content


class OpenAIChat:
    dialect: Dialect = Dialect.OPENAI
    stream_kind: StreamKind = StreamKind.SSE
    routes: tuple[Route, ...] = (
        Route("POST", "/v1/chat/completions", Endpoint.CHAT),
        Route("POST", "/v1/completions", Endpoint.COMPLETIONS),
        Route("POST", "/v1/embeddings", Endpoint.EMBEDDINGS),
    )

    def stream_default(self, endpoint: Endpoint) -> bool:
        return False

    def model_field(self, endpoint: Endpoint, payload: JSON) -> tuple[str, object]:
        return "model", payload.get("model")

    def error_body(self, err: TurnoutError) -> bytes:
        return error_body(err)

    def error_frame(self, err: TurnoutError, watch: StreamWatch | None = None) -> bytes:
        return b"data: " + error_body(err) + b"\n\n"

    def error_in_dialect(self, body: JSON) -> bool:
        err = body.get("error")
        return isinstance(err, dict) and isinstance(err.get("message"), str)

    def translation(self, worker: WorkerAPI, endpoint: Endpoint, native: frozenset[str]) -> Translation | None:
        return None

    def prompt_parts(self, call: Call) -> list[str]:
        payload = call.payload
        if call.endpoint is Endpoint.CHAT:
            return chat_parts(payload.get("messages"), payload.get("tools"), MESSAGE_EXTRA)
        if call.endpoint is Endpoint.COMPLETIONS:
            prompt = payload.get("prompt")
            return [] if prompt is None else [stable_text(prompt)]
        return []

    def session_key(self, call: Call, headers: Mapping[str, str]) -> str | None:
        payload = call.payload
        return text_field(payload, "prompt_cache_key") or text_field(payload, "user")


API = OpenAIChat()
