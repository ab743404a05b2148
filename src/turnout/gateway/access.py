"""The gateway's access log: one line per request, with who asked for what and how it went.

Text (``turnout serve``, the default; ``--no-access-log`` or ``logging.access_log: false`` turns it off)::

    127.0.0.1 "POST /v1/chat/completions HTTP/1.1" 200 1432 0.532s key=tk_AbCdEfG app=starter \
api=openai:chat model=llama3 worker=w1 tokens=12+30 route="prefix 0.83" priority=standard \
queue=0.1ms upstream=0.3ms ttft=512.3ms

``route`` says why the request went to that worker (:attr:`turnout.core.routing.Route.why`: ``prefix 0.83``,
``session``, ``history 0.70``, ``load guard``, ``least expected time``, ``only candidate``).
A request that named a model alias has ``model=`` the model served and ``alias=`` the name it asked for.
``priority`` is the class an inference call was served at (:mod:`turnout.core.priority`: its key's class, or the
lower one its ``X-Turnout-Priority`` header asked for).
``queue``, ``hold``, ``upstream`` and ``ttft`` say where its time went, in milliseconds, for each phase it went
through (:mod:`turnout.gateway.timing`; the seconds after the status and size are its total).
With ``--log-format json`` the same facts are fields of the record's JSON object (``remote``, ``method``,
``path``, ``status``, ``bytes``, ``latency_ms``, ``key``, ``app``, ``api``, ``model``, ``worker``,
``prompt_tokens``, ``completion_tokens``, ``route``, ``priority``, ``error``, ``fallback_from``, ``alias`` (the model
alias the client named), ``queue_ms``, ``hold_ms``, ``upstream_ms``, ``ttft_ms``, ``dropped_tools``: the hosted
tools of a Responses request that its worker cannot run, as the answer's ``X-Turnout-Dropped-Tools`` header says).
``key`` is the key's display prefix (``turnout key list`` shows the same), never the key; no request header is ever
written and secret-looking query values are redacted.

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

from turnout.dialects.responses.request import HOSTED_TOOL_NOTE
from turnout.gateway.timing import PHASES
from turnout.redaction import SECRETS, Redacted, redact, redact_target
from turnout.responses import ERROR_CODE

if TYPE_CHECKING:
    from turnout.core.priority import Chosen
    from turnout.store.keys import KeyRecord
    from turnout.store.usage import UsageRow

__all__ = ["CALLER", "ERROR_CODE", "PRIORITY", "REQUEST_ID", "ROUTE", "USAGE_ROW", "AccessLog"]

# The caller's key (None: open access without one), set once the request is authenticated.
CALLER: web.RequestKey[KeyRecord | None] = web.RequestKey("access_caller")
# The usage row of a proxied request (api, model, worker, tokens), set when it is accounted.
USAGE_ROW: web.RequestKey[UsageRow] = web.RequestKey("access_usage")
# The request's id, for APIs whose answers carry one (Anthropic's ``request-id`` header and error field).
REQUEST_ID: web.RequestKey[str] = web.RequestKey("request_id")
# Why the proxy sent it to its worker (``prefix 0.83``, ``load guard``...), set when a worker was chosen.
ROUTE: web.RequestKey[str] = web.RequestKey("access_route")
# The priority class an inference call is served at (and what its header asked), decided once its key is known.
PRIORITY: web.RequestKey[Chosen] = web.RequestKey("access_priority")

_PHASE_FIELDS = {"queue": "queue_ms", "hold": "hold_ms", "upstream": "upstream_ms", "ttft": "ttft_ms"}

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


# A gateway sees few distinct clients, request lines, keys and models: what the line is made of is kept, up to
# this many entries per kind (the cache is emptied when full), for texts up to _CACHED_TEXT characters.
_CACHED = 1024
_CACHED_TEXT = 256


def _cached(cache: dict[Any, Any], key: tuple[Any, ...], make: Any, text: str) -> Any:
    """``cache[key]``, made by ``make(*key)`` the first time; not kept when ``text`` is long (a client's odd path
    or model name: made each time, so that the caches stay small whatever clients send)."""
    value = cache.get(key)
    if value is None:
        value = make(*key)
        if len(text) <= _CACHED_TEXT:
            if len(cache) >= _CACHED:
                cache.clear()
            cache[key] = value
    return value


def _head(remote: str | None, method: str, raw_path: str, major: int, minor: int) -> tuple[str, str, str, str]:
    """(remote, method, path, the line's start) as written: one line each, the path redacted."""
    who, verb, path = _one_line(remote or "-", 64), _one_line(method, 16), _one_line(redact_target(raw_path), 2048)
    return who, verb, path, f'{who} "{verb} {path} HTTP/{major}.{minor}"'


def _caller(prefix: str, app: str) -> str:
    return f" key={_value(prefix)} app={_value(app)}"


def _served(api: str, model: str, worker: str | None) -> tuple[str, str]:
    """(the redacted model, the line's part for api, model and worker)."""
    shown = redact(model)  # the client's text
    return shown, f" api={api} model={_value(shown)} worker={_value(worker or '-')}"


def _route(why: str) -> str:
    """``why`` quoted as the line writes a value with a space (the router's own words: no escaping needed)."""
    return f'"{why}"' if " " in why else why


class AccessLog(AbstractAccessLogger):
    """One record per request: a human line as the message, the same facts as record attributes (the JSON
    formatter writes them as fields). A request aiohttp could not parse is left to the server log, which
    already wrote its one line.

    What repeats from request to request (the client's address, the request line, the key, the model) is put
    together once and kept: this runs after every request, and building the line was a third of its cost."""

    def __init__(self, logger: logging.Logger, log_format: str) -> None:
        super().__init__(logger, log_format)
        self._heads: dict[tuple[Any, ...], tuple[str, str, str, str]] = {}
        self._callers: dict[tuple[str, str], str] = {}
        self._served: dict[tuple[str, str, str | None], tuple[str, str]] = {}
        self._secrets = SECRETS.version

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        if _PLACEHOLDER is not None and request.headers is _PLACEHOLDER.headers:
            return  # aiohttp's stand-in for a request it could not parse
        if self._secrets != SECRETS.version:  # a credential came or went: what was redacted before is stale
            self._heads.clear()
            self._served.clear()
            self._secrets = SECRETS.version
        version = request.version
        raw_path = request.raw_path
        remote, method, path, head = _cached(
            self._heads, (request.remote, request.method, raw_path, version.major, version.minor), _head, raw_path
        )
        status, size = response.status, response.body_length
        fields: dict[str, Any] = {
            "remote": remote,
            "method": method,
            "path": path,
            "status": status,
            "bytes": size,
            "latency_ms": round(time * 1000, 1),
        }
        line = f"{head} {status} {size} {time:.3f}s"
        key = request.get(CALLER)
        if key is not None:
            fields["key"], fields["app"] = key.prefix, key.app
            line += _cached(self._callers, (key.prefix, key.app), _caller, key.app)
        row = request.get(USAGE_ROW)
        if row is not None:
            model, part = _cached(self._served, (row.endpoint, row.model, row.worker), _served, row.model)
            fields.update(api=row.endpoint, model=model, worker=row.worker)
            fields.update(prompt_tokens=row.prompt_tokens, completion_tokens=row.completion_tokens)
            line += f"{part} tokens={row.prompt_tokens}+{row.completion_tokens}"
            if row.alias is not None:
                asked = fields["alias"] = redact(row.alias)
                line += f" alias={_value(asked)}"
            why = request.get(ROUTE)
            if why is not None:
                fields["route"] = why
                line += f" route={_route(why)}"
            if row.fallback_from is not None:
                origin = fields["fallback_from"] = redact(row.fallback_from)
                line += f" fallback_from={_value(origin)}"
            dropped = response.headers.get(HOSTED_TOOL_NOTE)
            if dropped is not None:
                fields["dropped_tools"] = dropped
                line += f" dropped_tools={_value(dropped)}"
        chosen = request.get(PRIORITY)
        if chosen is not None:
            fields["priority"] = chosen.priority.value
            line += f" priority={chosen.priority.value}"
        phases = request.get(PHASES)
        if phases is not None:  # where its time went: queue, hold, upstream, ttft (total: the seconds above)
            for name, seconds in phases.told():
                ms = round(seconds * 1000, 1)
                fields[_PHASE_FIELDS[name]] = ms
                line += f" {name}={ms}ms"
        code = response.get(ERROR_CODE) if status >= 400 else None  # only error answers have one
        if code is not None:
            fields["error"] = code
            line += f" error={_value(code)}"
        # Each part is safe as put together (the path and model redacted, a key's prefix only): the handler's
        # filter does not scan the whole line again.
        self.logger.info(Redacted(line), extra=fields)

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)
