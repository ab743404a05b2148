"""The error hierarchy every adapter raises and one handler per dialect renders.

::

    TurnoutError (status, code)
    +-- BadRequest            400 invalid_request_error
    +-- Unauthorized          401 unauthorized
    +-- Forbidden             403 model_blocked
    +-- NotFound              404 not_found / model_not_found
    +-- Conflict              409 conflict
    +-- PreconditionFailed    412 stale_write (an If-Match naming a state that has changed)
    +-- PayloadTooLarge       413 payload_too_large
    +-- Unprocessable         422 invalid_field (field: the path of the bad field, or None)
    +-- Unavailable           503 service_unavailable (retry_after: seconds or None)
    +-- UpstreamError         502 upstream_error (a worker failed or answered nonsense)

Foreign exceptions (aiohttp, OS errors) are translated into these at the adapter that sees them.
"""

from __future__ import annotations

__all__ = [
    "BadRequest",
    "Conflict",
    "Forbidden",
    "NotFound",
    "PayloadTooLarge",
    "PreconditionFailed",
    "TurnoutError",
    "Unauthorized",
    "Unavailable",
    "Unprocessable",
    "UpstreamError",
]


class TurnoutError(Exception):
    status = 500
    code = "internal_error"
    type = "server_error"

    def __init__(self, message: str, *, code: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.retry_after = retry_after
        self.headers: dict[str, str] = {}


class BadRequest(TurnoutError):
    status = 400
    code = "invalid_request_error"
    type = "invalid_request_error"


class Unauthorized(TurnoutError):
    status = 401
    code = "unauthorized"
    type = "authentication_error"


class Forbidden(TurnoutError):
    status = 403
    code = "model_blocked"
    type = "permission_error"


class NotFound(TurnoutError):
    status = 404
    code = "not_found"
    type = "invalid_request_error"


class Conflict(TurnoutError):
    status = 409
    code = "conflict"
    type = "invalid_request_error"


class PreconditionFailed(TurnoutError):
    """412: the client's ``If-Match`` names a state that has changed since it read it."""

    status = 412
    code = "stale_write"
    type = "invalid_request_error"


class PayloadTooLarge(TurnoutError):
    status = 413
    code = "payload_too_large"
    type = "invalid_request_error"


class Unprocessable(TurnoutError):
    """A well-formed request with a field out of range or of the wrong kind; the message names the field."""

    status = 422
    code = "invalid_field"
    type = "invalid_request_error"

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.field = field


class Unavailable(TurnoutError):
    status = 503
    code = "service_unavailable"
    type = "server_error"


class UpstreamError(TurnoutError):
    status = 502
    code = "upstream_error"
    type = "server_error"
