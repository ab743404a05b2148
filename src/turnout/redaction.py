"""Logs that never carry a secret: aiohttp's server and access logging, and the log handlers of the CLI.

aiohttp's request handler logs a malformed request (bad header bytes, an oversized header, a bad request
line or Content-Length) with a traceback whose exception text echoes the raw bytes it could not parse, an
``Authorization`` value among them. :func:`handler_args` gives the gateway's ``web.Application`` a server
log that turns such a request into one line (no traceback, no request bytes: only the parser's reason), and
an access log that writes method, path (secret query values redacted), status, size and time, never a
header. :class:`RedactingFilter` is put on the CLI's log handlers so that every record, whoever logs it,
has every credential masked.
What is masked and how: :mod:`turnout.masking`.

Used by :func:`turnout.wiring.create_app`, the runtime agent's app and the ``turnout serve|agent|controller``
commands.
"""

from __future__ import annotations

import logging
import re
import sys
import time
import traceback
from typing import Any

from aiohttp import http_exceptions, web_protocol
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web import BaseRequest, StreamResponse

from turnout.masking import REDACTED, SECRETS, SecretValues, redact, redact_target

__all__ = [
    "REDACTED",
    "SECRETS",
    "AccessLog",
    "Redacted",
    "RedactingFilter",
    "SecretValues",
    "ServerLog",
    "configure_logging",
    "handler_args",
    "redact",
    "redact_target",
]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_MAX_REASON = 120
_REASONS = (  # these quote request data in their message: a fixed text instead (most specific first)
    (http_exceptions.LineTooLong, "request line or header too long"),
    (http_exceptions.InvalidHeader, "invalid header"),
    (http_exceptions.BadHttpMethod, "bad method"),
    (http_exceptions.BadStatusLine, "bad request line"),
    (http_exceptions.InvalidURLError, "invalid URL"),
    (http_exceptions.ContentLengthError, "body shorter than its Content-Length"),
    (http_exceptions.TransferEncodingError, "bad chunked body"),
    (http_exceptions.ContentEncodingError, "bad content encoding"),
)
# aiohttp answers a request it could not parse through a placeholder request built from this message.
_PLACEHOLDER = getattr(web_protocol, "ERROR", None)


class Redacted(str):
    """A log message whose parts were redacted where they were put together (the access log's line): the
    handler filter passes it as it is, instead of running the patterns over the whole line again."""

    __slots__ = ()


def _one_line(text: str, limit: int) -> str:
    return _CONTROL.sub(" ", text)[:limit]


def _reason(exc: HttpProcessingError) -> str:
    """What was wrong, without the bytes the parser quotes (they may be a credential)."""
    for kind, reason in _REASONS:
        if isinstance(exc, kind):
            return reason
    # Otherwise a fixed text: llhttp's reason before the data it quotes ("Invalid header value char:\n\n  b'...'"),
    # or one of aiohttp's own ("Duplicate 'Content-Length' header found.", "Too many headers received").
    first = (exc.message or "").split("\n", 1)[0].removesuffix(":").strip()
    if not first or "b'" in first or 'b"' in first or "\\" in first:  # quoted bytes after all: say only the kind
        return type(exc).__name__
    return _one_line(redact(first), _MAX_REASON)


class ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]  # generic only in typeshed
    """aiohttp's request-handler logger (``aiohttp.server``) with malformed requests on one line and every
    message and traceback redacted before it reaches any handler."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        super().__init__(logger or logging.getLogger("aiohttp.server"), {})

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if not self.isEnabledFor(min(level, logging.INFO)):
            return
        exc_info = kwargs.pop("exc_info", None)
        if exc_info is True:
            exc_info = sys.exc_info()
        exc = exc_info[1] if isinstance(exc_info, tuple) else exc_info
        if isinstance(exc, HttpProcessingError):
            # A client's bad bytes, not a gateway fault: one line, the parser's reason, no request data.
            remote = args[0] if msg == "Error handling request from %s" and args else "a client"
            line = f"malformed HTTP request from {_one_line(str(remote), 64)}: {exc.code} {_reason(exc)}"
            self.logger.log(min(level, logging.INFO), "%s", line, **kwargs)
            return
        text = str(msg) % args if args else str(msg)
        if isinstance(exc, BaseException):
            trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
            text = f"{text}\n{trace}"
        self.logger.log(level, "%s", redact(text), **kwargs)


class AccessLog(AbstractAccessLogger):
    """One line per request: ``remote "METHOD /path?query HTTP/1.1" status bytes seconds``; query values that
    look like credentials are redacted and no header is ever written. A request aiohttp could not parse is
    left to the server log, which already wrote its one line."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        if _PLACEHOLDER is not None and request.headers is _PLACEHOLDER.headers:
            return  # aiohttp's stand-in for a request it could not parse
        version = request.version
        self.logger.info(
            '%s "%s %s HTTP/%d.%d" %d %d %.3fs',
            _one_line(request.remote or "-", 64),
            _one_line(request.method, 16),
            _one_line(redact_target(request.raw_path), 2048),
            version.major,
            version.minor,
            response.status,
            response.body_length,
            time,
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


class RedactingFilter(logging.Filter):
    """For log handlers: masks secrets in every record's message and traceback (aiohttp's, turnout's, any)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if type(record.msg) is Redacted and not record.args and not record.exc_info:
            return True
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def handler_args() -> dict[str, Any]:
    """``web.Application(handler_args=...)``: the redacting server log and access log class, whatever runner
    serves the app (``run_app``, an ``AppRunner`` in tests); the runner still decides whether access logging
    is on (``access_log=None`` turns it off)."""
    return {"logger": ServerLog(), "access_log_class": AccessLog}


class _CliHandler(logging.StreamHandler):  # type: ignore[type-arg]  # generic only in typeshed
    """The stderr handler :func:`configure_logging` installs (and replaces when called again)."""


class _TextFormatter(logging.Formatter):
    """logging's text formatter, with the time's text made once a second (not once a line: the access log
    writes a line per request)."""

    def __init__(self, fmt: str) -> None:
        super().__init__(fmt)
        self._second = -1
        self._text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._text = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = second
        return f"{self._text},{int(record.msecs):03d}"  # logging's default_msec_format, "%s,%03d"


def _formatter(log_format: str, pid: bool = False) -> logging.Formatter:
    if log_format != "json":
        if pid:  # `serve --workers N`: which process wrote the line
            return _TextFormatter("%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
        return _TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pythonjsonlogger.orjson import OrjsonFormatter  # imported only when asked for: the CLI starts fast

    # {"time": "2026-12-03T18:20:00.123+00:00", "level": "INFO", "logger": "turnout.access", "message": ...,
    #  plus the record's extra fields (the access log's: status, latency_ms, key, model, ...)}
    return OrjsonFormatter(
        "{levelname}{name}{message}{process}" if pid else "{levelname}{name}{message}",
        style="{",
        rename_fields={"levelname": "level", "name": "logger", "process": "pid"},
        timestamp="time",
    )


def configure_logging(level: str, log_format: str = "text", *, pid: bool = False) -> None:
    """The CLI's logging: one stderr handler at ``level`` whose records are redacted; ``log_format`` ``json``
    writes each record as one JSON object per line. Called again (once the config is read), it replaces its
    own handler; handlers someone else installed on the root logger (a test runner's) are left as they are.
    ``pid``: each line names the process that wrote it (`serve --workers N`)."""
    # No format here shows where a call came from or which thread made it (the process only with ``pid``):
    # the logging HOWTO's "Optimization" switches skip collecting them (a stack walk per record; about 3 us
    # of each access line).
    logging._srcfile = None
    logging.logThreads = logging.logMultiprocessing = False
    logging.logProcesses = pid
    root = logging.getLogger()
    root.setLevel(level.upper())
    ours = [h for h in root.handlers if isinstance(h, _CliHandler)]
    if ours or not root.handlers:
        for old in ours:
            root.removeHandler(old)
        fresh = _CliHandler()
        fresh.setFormatter(_formatter(log_format, pid))
        root.addHandler(fresh)
    for handler in root.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
