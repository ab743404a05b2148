"""The OpenAI API as clients speak it: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``.

Errors are OpenAI's ``{"error": {"message", "type", "code"}}``; streams are SSE (``data:`` events, ``data: [DONE]``).
Every worker takes these requests as they are: OpenAI-style servers natively, and Ollama through its own OpenAI
routes (``/v1/...``, ``server/routes.go``), so nothing is translated.
"""

from __future__ import annotations

import orjson

from turnout.dialects.base import JSON, Dialect, Endpoint, Route, Translation, WorkerAPI
from turnout.dialects.streams import StreamKind, StreamWatch
from turnout.errors import TurnoutError

__all__ = ["API", "OpenAIChat", "error_body"]


def error_body(err: TurnoutError, *, field: bool = False) -> bytes:
    """OpenAI's error object; ``field``: with the bad field of a 422 (the admin API's form of it)."""
    body: dict[str, object] = {"message": err.message, "type": err.type, "code": err.code}
    bad = getattr(err, "field", None)
    if field and bad:  # a 422's field, for the admin UI to show the message next to it
        body["field"] = bad
    return orjson.dumps({"error": body})


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


API = OpenAIChat()
