"""Rendering errors in the caller's dialect: JSON bodies, SSE error frames, NDJSON error lines."""

from __future__ import annotations

from enum import StrEnum

import orjson
from aiohttp import web

from turnout.errors import TurnoutError
from turnout.gateway.access import ERROR_CODE

__all__ = ["MAX_UNAVAILABLE_RETRY_S", "Dialect", "error_frame", "error_response", "json_response"]


class Dialect(StrEnum):
    OPENAI = "openai"
    OLLAMA = "ollama"
    ADMIN = "admin"


def error_body(dialect: Dialect, err: TurnoutError) -> bytes:
    if dialect is Dialect.OLLAMA:
        return orjson.dumps({"error": err.message})
    body: dict[str, object] = {"message": err.message, "type": err.type, "code": err.code}
    field = getattr(err, "field", None)
    if dialect is Dialect.ADMIN and field:  # a 422's field, for the admin UI to show the message next to it
        body["field"] = field
    return orjson.dumps({"error": body})


def json_response(obj: object, status: int = 200) -> web.Response:
    """A JSON answer (orjson); every handler that answers JSON uses this."""
    return web.Response(status=status, body=orjson.dumps(obj), content_type="application/json")


# A 503's Retry-After is a hint to come back soon, never a configured interval (a health interval of an
# hour must not make clients wait an hour for a model that wakes in seconds). 429s keep theirs: a token
# budget really does reset at a known time.
MAX_UNAVAILABLE_RETRY_S = 30


def error_response(dialect: Dialect, err: TurnoutError) -> web.Response:
    headers = dict(err.headers)
    if err.retry_after is not None:
        retry = max(1, err.retry_after)
        headers["Retry-After"] = str(min(retry, MAX_UNAVAILABLE_RETRY_S) if err.status == 503 else retry)
    response = web.Response(
        status=err.status, body=error_body(dialect, err), content_type="application/json", headers=headers
    )
    response[ERROR_CODE] = err.code  # for the access log
    return response


def error_frame(dialect: Dialect, err: TurnoutError) -> bytes:
    """The last frame of a stream that failed after it started."""
    if dialect is Dialect.OLLAMA:
        return error_body(dialect, err) + b"\n"
    return b"data: " + error_body(dialect, err) + b"\n\n"
