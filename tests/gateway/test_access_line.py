"""The access line as built (:class:`turnout.gateway.access.AccessLog`) and the text formatter's time: what
is kept from one request to the next never changes what a line says."""

from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from turnout.gateway import access
from turnout.gateway.access import CALLER, USAGE_ROW, AccessLog
from turnout.redaction import _formatter
from turnout.store.usage import UsageRow


class _Key:
    def __init__(self, prefix: str, app: str) -> None:
        self.prefix, self.app = prefix, app


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _row(model: str, worker: str | None = "w1", prompt: int = 5, completion: int = 4) -> UsageRow:
    return UsageRow(
        ts=0.0,
        key_id=1,
        endpoint="openai:chat",
        model=model,
        worker=worker,
        status=200,
        error=False,
        prompt_tokens=prompt,
        completion_tokens=completion,
        latency_ms=1.0,
        fallback_from=None,
    )


def _line(log: AccessLog, capture: _Capture, path: str, key: Any = None, row: UsageRow | None = None) -> str:
    request = make_mocked_request("POST", path)
    if key is not None:
        request[CALLER] = key
    if row is not None:
        request[USAGE_ROW] = row
    log.log(request, web.Response(status=200), 0.25)
    return capture.records[-1].getMessage()


def _access_log() -> tuple[AccessLog, _Capture]:
    logger = logging.getLogger("test.access_line")
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(logging.INFO)
    capture = _Capture()
    logger.addHandler(capture)
    return AccessLog(logger, ""), capture


def test_lines_are_the_same_whether_their_parts_were_kept_or_made() -> None:
    log, capture = _access_log()
    a, b = _Key("tk_AAAAAAA", "web"), _Key("tk_BBBBBBB", "my app")
    cases = [
        ("/v1/chat/completions", a, _row("llama3")),
        ("/v1/chat/completions", a, _row("llama3", prompt=7, completion=1)),
        ("/v1/chat/completions", b, _row("qwen 3", worker=None)),
        ("/v1/chat/completions?api_key=tk_secret123456", None, None),
        ("/v1/chat/completions", None, None),
    ]
    first = [_line(log, capture, *case) for case in cases]
    again = [_line(log, capture, *case) for case in cases]  # now from what was kept
    assert first == again
    assert first[0] == (
        '- "POST /v1/chat/completions HTTP/1.1" 200 0 0.250s key=tk_AAAAAAA app=web api=openai:chat '
        "model=llama3 worker=w1 tokens=5+4"
    )
    assert first[1].endswith("tokens=7+1")
    assert 'app="my app"' in first[2] and 'model="qwen 3" worker=-' in first[2]
    assert "tk_secret" not in first[3] and "api_key=" in first[3]
    assert first[4] == '- "POST /v1/chat/completions HTTP/1.1" 200 0 0.250s'
    record = capture.records[0]
    assert (record.key, record.app, record.model, record.worker, record.prompt_tokens) == (  # type: ignore[attr-defined]
        "tk_AAAAAAA",
        "web",
        "llama3",
        "w1",
        5,
    )


def test_what_is_kept_stays_small_whatever_clients_send() -> None:
    log, capture = _access_log()
    long_path = "/v1/chat/completions?" + "x" * 1000
    line = _line(log, capture, long_path)
    assert "x" * 1000 in line
    assert not log._heads  # a long request line is made each time, never kept
    for n in range(access._CACHED + 10):
        _line(log, capture, f"/v1/models/{n}")
    assert 0 < len(log._heads) <= access._CACHED
    assert _line(log, capture, "/v1/models/3") == '- "POST /v1/models/3 HTTP/1.1" 200 0 0.250s'


def test_the_text_formatters_time_is_loggings_own() -> None:
    ours = _formatter("text")
    theirs = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    start = time.time()
    for offset in (0.0, 0.001, 0.5, 0.999, 1.0, 1.0004, 61.25, 3600.7, 0.2):  # back in time too
        record = logging.LogRecord("turnout.access", logging.INFO, "", 0, "line", None, None)
        record.created = start + offset
        record.msecs = (record.created - int(record.created)) * 1000
        assert ours.format(record) == theirs.format(record)
