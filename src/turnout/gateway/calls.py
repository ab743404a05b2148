"""Parsing a client request into a :class:`Call`: dialect, endpoint, model, stream flag, body.

Every malformed input becomes a 400/413 :class:`TurnoutError` here, before any routing happens.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson
from aiohttp import web

from turnout.errors import BadRequest, PayloadTooLarge
from turnout.gateway.dialect import Dialect

__all__ = ["Call", "Endpoint", "read_call"]


class Endpoint(StrEnum):
    CHAT = "chat"  # /v1/chat/completions, /api/chat
    COMPLETIONS = "completions"  # /v1/completions
    EMBEDDINGS = "embeddings"  # /v1/embeddings
    GENERATE = "generate"  # /api/generate
    EMBED = "embed"  # /api/embed
    EMBED_LEGACY = "embeddings_legacy"  # /api/embeddings
    SHOW = "show"  # /api/show

    @property
    def streams(self) -> bool:
        return self in (Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.GENERATE)


@dataclass(frozen=True, slots=True)
class Call:
    dialect: Dialect
    endpoint: Endpoint
    path: str
    body: bytes
    payload: dict[str, Any]
    model: str
    stream: bool
    fallback_from: str | None = None  # "<endpoint>/<model>" when this call is a fallback


async def read_call(request: web.Request, dialect: Dialect, endpoint: Endpoint, max_body: int) -> Call:
    if request.content_length is not None and request.content_length > max_body:
        raise _too_large(max_body)
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(max_body) from None
    if not body:
        raise BadRequest('request body is empty; send a JSON object with at least "model"')
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise BadRequest("request body must be a JSON object")
    model = payload.get("model")
    if endpoint is Endpoint.SHOW and model is None:
        model = payload.get("name")  # older Ollama clients send "name"
    if not isinstance(model, str) or not model.strip():
        raise BadRequest('missing "model": name the model to use', code="missing_model")
    stream_default = dialect is Dialect.OLLAMA and endpoint in (Endpoint.CHAT, Endpoint.GENERATE)
    stream = payload.get("stream", stream_default)
    if stream is None:
        stream = stream_default
    if not isinstance(stream, bool):
        raise BadRequest('"stream" must be true or false')
    return Call(dialect, endpoint, request.path, body, payload, model, stream and endpoint.streams)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body is larger than the limit of {limit} bytes (limits.max_body_bytes)")
