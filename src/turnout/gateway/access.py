"""The gateway's access log: one line per request, with who asked for what and how it went.

Text (``turnout serve``, the default; ``--no-access-log`` or ``logging.access_log: false`` turns it off)::

    127.0.0.1 "POST /v1/chat/completions HTTP/1.1" 200 1432 0.532s key=tk_AbCdEfG app=starter \
api=openai:chat model=llama3 worker=w1 tokens=12+30

With ``--log-format json`` the same facts are fields of the record's JSON object (``remote``, ``method``,
``path``, ``status``, ``bytes``, ``latency_ms``, ``key``, ``app``, ``api``, ``model``, ``worker``,
``prompt_tokens``, ``completion_tokens``, ``error``, ``fallback_from``). ``key`` is the key's display prefix
(``turnout key list`` shows the same), never the key; no header is ever written and secret-looking query
values are redacted.

The request path stays cheap: handlers only hang what they already hold on the request (:data:`CALLER`, the
usage row as :data:`USAGE_ROW`) and error responses their code (:data:`ERROR_CODE`); the line is built here,
after the response is sent, and only when the access log is on (aiohttp does not call a disabled one).
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web, web_protocol
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

from turnout.redaction import Redacted, redact

if TYPE_CHECKING:
    from turnout.store.keys import KeyRecord
    from turnout.store.usage import UsageRow

__all__ = ["CALLER", "ERROR_CODE", "USAGE_ROW", "AccessLog"]

# The caller's key (None: open access without one), set once the request is authenticated.
CALLER: web.RequestKey[KeyRecord | None] = web.RequestKey("access_caller")
# The usage row of a proxied request (api, model, worker, tokens), set when it is accounted.
USAGE_ROW: web.RequestKey[UsageRow] = web.RequestKey("access_usage")
# The ``code`` of an error answer, set by :func:`turnout.gateway.dialect.error_response`.
ERROR_CODE: web.ResponseKey[str] = web.ResponseKey("access_error_code")

# aiohttp answers a request it could not parse through a placeholder request built from this message.
_PLACEHOLDER = getattr(web_protocol, "ERROR", None)
_PLAIN = re.compile(r"[A-Za-z0-9._:/+@-]+")


def _one_line(text: str, limit: int) -> str:
    text = text[:limit]
    return text if text.isprintable() else "".join(ch if ch.isprintable() else " " for ch in text)


def _value(text: str) -> str:
    """A field value as it is when plain, else quoted JSON (spaces, quotes, control characters)."""
    if _PLAIN.fullmatch(text):
        return text
    return orjson.dumps(text[:256]).decode()


class AccessLog(AbstractAccessLogger):
    """One record per request: a human line as the message, the same facts as record attributes (the JSON
    formatter writes them as fields). A request aiohttp could not parse is left to the server log, which
    already wrote its one line."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        if _PLACEHOLDER is not None and request.headers is _PLACEHOLDER.headers:
            return  # aiohttp's stand-in for a request it could not parse
        version = request.version
        fields: dict[str, Any] = {
            "remote": _one_line(request.remote or "-", 64),
            "method": _one_line(request.method, 16),
            "path": _one_line(redact(request.raw_path), 2048),
            "status": response.status,
            "bytes": response.body_length,
            "latency_ms": round(time * 1000, 1),
        }
        line = (
            f'{fields["remote"]} "{fields["method"]} {fields["path"]} HTTP/{version.major}.{version.minor}" '
            f"{response.status} {response.body_length} {time:.3f}s"
        )
        key = request.get(CALLER)
        if key is not None:
            fields["key"], fields["app"] = key.prefix, key.app
            line += f" key={_value(key.prefix)} app={_value(key.app)}"
        row = request.get(USAGE_ROW)
        if row is not None:
            model = redact(row.model)  # the client's text
            fields.update(api=row.endpoint, model=model, worker=row.worker)
            fields.update(prompt_tokens=row.prompt_tokens, completion_tokens=row.completion_tokens)
            line += f" api={row.endpoint} model={_value(model)} worker={_value(row.worker or '-')}"
            line += f" tokens={row.prompt_tokens}+{row.completion_tokens}"
            if row.fallback_from is not None:
                origin = fields["fallback_from"] = redact(row.fallback_from)
                line += f" fallback_from={_value(origin)}"
        code = response.get(ERROR_CODE)
        if code is not None:
            fields["error"] = code
            line += f" error={_value(code)}"
        # Each part is safe as put together (the path and model redacted, a key's prefix only): the handler's
        # filter does not scan the whole line again.
        self.logger.info(Redacted(line), extra=fields)

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)
