"""Answers as aiohttp responses: JSON bodies, and errors in a dialect's shape (:mod:`turnout.dialects`).

Used by the gateway, the admin API and the runtime agent alike, so that every error anywhere has its API's shape
and the status, ``Retry-After`` and code the error type says (:mod:`turnout.errors`).
"""

from __future__ import annotations

import orjson
from aiohttp import web

from turnout.dialects import api
from turnout.dialects.base import Dialect
from turnout.dialects.streams import StreamWatch
from turnout.errors import TurnoutError

__all__ = [
    "ERROR",
    "ERROR_CODE",
    "MAX_UNAVAILABLE_RETRY_S",
    "Dialect",
    "error_frame",
    "error_response",
    "json_response",
]

# The ``code`` of an error answer, for the access log (:mod:`turnout.gateway.access`).
ERROR_CODE: web.ResponseKey[str] = web.ResponseKey("access_error_code")
# The error an error answer says (a held stream whose headers went out says it as its last event instead:
# :mod:`turnout.gateway.held_stream`).
ERROR: web.ResponseKey[TurnoutError] = web.ResponseKey("error")


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
        status=err.status, body=api(dialect).error_body(err), content_type="application/json", headers=headers
    )
    response[ERROR_CODE] = err.code  # for the access log
    response[ERROR] = err
    return response


def error_frame(dialect: Dialect, err: TurnoutError, watch: StreamWatch | None = None) -> bytes:
    """The last frame of a stream that failed after it started (``watch``: the worker's stream, passed through)."""
    return api(dialect).error_frame(err, watch)
