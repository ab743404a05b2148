"""Logs never carry a secret: `turnout serve` as a user runs it, fed malformed and normal requests on a raw socket.

Each malformed request carries an ``Authorization: Bearer tk_...`` key and an ``X-Api-Key``-style secret; the
gateway must answer it (400) and log exactly one line about it, with no traceback and neither secret. Both of
aiohttp's HTTP parsers are exercised: the C one (default) and the pure-Python one (``AIOHTTP_NO_EXTENSIONS``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import GatewayFactory, eventually, free_port
from turnout.redaction import REDACTED, RedactingFilter, ServerLog, redact

KEY_SECRET = "Zq9SeCrEtKeYvAlUe0123456789abcdefghijklmnop"  # 43 URL-safe characters, like a real key's tail
KEY = f"tk_{KEY_SECRET}"
API_SECRET = "sk-live-9f8e7d6c5b4a39281706"
SECRETS = (KEY_SECRET, API_SECRET, KEY_SECRET[:12], API_SECRET[-12:])


@dataclass
class Served:
    port: int
    log: Path
    key: str  # the starter key the gateway printed (a real, working key)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def lines(self) -> list[str]:
        return self.text().splitlines()


def _until(check: Callable[[], object], what: str, limit_s: float = 20) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _raw(port: int, data: bytes) -> bytes:
    """Send ``data`` as it is; return what the gateway answers until it closes the connection."""
    chunks = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
    return b"".join(chunks)


@pytest.fixture(params=["c-parser", "python-parser"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"storage": {"data_dir": "state"}, "workers": []}))
    env = {k: v for k, v in os.environ.items() if k not in ("TURNOUT_ADMIN_TOKEN", "AIOHTTP_NO_EXTENSIONS")}
    if request.param == "python-parser":
        env["AIOHTTP_NO_EXTENSIONS"] = "1"
    port = free_port()
    log = tmp_path / "serve.log"
    out = tmp_path / "serve.out"
    with log.open("wb") as err_file, out.open("wb") as out_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "turnout", "serve", "-c", str(config), "--port", str(port), "--access-log"],
            cwd=tmp_path,
            stdout=out_file,
            stderr=err_file,
            env=env,
        )
    try:
        _until(lambda: proc.poll() is not None or _healthy(port), "turnout serve to answer /healthz")
        assert proc.poll() is None, log.read_text()
        key = next(line.strip() for line in out.read_text().splitlines() if line.strip().startswith("tk_"))
        yield Served(port, log, key)
    finally:
        proc.terminate()
        proc.wait(20)


def _healthy(port: int) -> bool:
    try:
        return b" 200 " in _raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")[:20]
    except OSError:
        return False


AUTH = f"Authorization: Bearer {KEY}\r\nX-Api-Key: {API_SECRET}\r\n".encode()
LONG = "A" * 9000  # over aiohttp's 8190-byte line and field limits

MALFORMED = {
    "control byte in the Authorization value": (
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\x01\r\n"
        b"X-Api-Key: " + API_SECRET.encode() + b"\r\n\r\n"
    ),
    "control byte in the X-Api-Key value": (
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH[: AUTH.index(b"X-Api")] + b"X-Api-Key: "
        b"" + API_SECRET.encode() + b"\x7f\x00\r\n\r\n"
    ),
    "oversized Authorization header": (
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Api-Key: " + API_SECRET.encode() + b"\r\n"
        b"Authorization: Bearer " + KEY.encode() + LONG.encode() + b"\r\n\r\n"
    ),
    "oversized X-Api-Key header": (
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
        + AUTH
        + b"X-Api-Key-2: "
        + API_SECRET.encode()
        + LONG.encode()
        + b"\r\n\r\n"
    ),
    "secret as a header name": (
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Bearer " + KEY.encode() + b" no colon\r\n\r\n"
    ),
    "bad request line with the key in it": (
        b"GET /v1/models?key=" + KEY.encode() + b" HTTP/1.1 junk\r\nHost: x\r\n" + AUTH + b"\r\n"
    ),
    "bad method": (b"G\x01T /?api_key=" + API_SECRET.encode() + b" HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n"),
    "oversized request line with the key in it": (
        b"GET /v1/models?key=" + KEY.encode() + LONG.encode() + b" HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n"
    ),
    "invalid Content-Length": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Length: 12abc\r\n\r\n{}"
    ),
    "negative Content-Length": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Length: -5\r\n\r\n{}"
    ),
    "duplicate Content-Length": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        + AUTH
        + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}"
    ),
    "bad chunk size": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Transfer-Encoding: chunked\r\n\r\n"
        b"zz" + KEY.encode() + b"\r\n{}\r\n0\r\n\r\n"
    ),
    "bad HTTP version": (b"GET / HTTP/9." + KEY.encode() + b"\r\nHost: x\r\n" + AUTH + b"\r\n"),
}


def _no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"a secret ({secret[:4]}...) reached the log:\n{text}"


def test_malformed_requests_log_one_line_without_secrets(served: Served) -> None:
    for name, data in MALFORMED.items():
        before = len(served.lines())
        answer = _raw(served.port, data)
        assert answer[:12] in (b"HTTP/1.0 400", b"HTTP/1.1 400"), f"{name}: {answer[:200]!r}"
        # A normal request after it: once its access line is there, the malformed one's line is too.
        probe = f"/healthz?after={len(answer)}-{before}"
        _raw(served.port, f"GET {probe} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        _until(lambda probe=probe: probe in served.text(), f"the access line of {probe}")
        new = [line for line in served.lines()[before:] if probe not in line]
        # aiohttp keeps a bad method on a connection's first request at debug level (scanners, TLS on the
        # HTTP port): no line at info. Every other malformed request is exactly one line.
        assert len(new) == (0 if name == "bad method" else 1), f"{name}: expected one log line, got {new}"
        assert all("malformed HTTP request" in line for line in new), f"{name}: {new}"
        _no_secret("\n".join(new))
    text = served.text()
    assert "Traceback" not in text
    _no_secret(text)


def test_access_log_never_shows_a_key(served: Served) -> None:
    for path in ("/v1/models", f"/v1/models?key={served.key}&api_key={API_SECRET}", f"/api/tags?token={KEY}"):
        request = (
            f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {served.key}\r\n"
            f"X-Api-Key: {API_SECRET}\r\nCookie: session={API_SECRET}\r\nConnection: close\r\n\r\n"
        )
        answer = _raw(served.port, request.encode())
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    _until(lambda: served.text().count('"GET /') >= 3, "three access lines")
    text = served.text()
    access = [line for line in text.splitlines() if '"GET /v1/models' in line or '"GET /api/tags' in line]
    assert len(access) == 3 and all(" 200 " in line for line in access), text
    assert f"key={REDACTED}" in access[1] and f"token={REDACTED}" in access[2]
    assert served.key not in text and served.key[3:] not in text
    _no_secret(text)


# -- the pieces, in process -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (f"Authorization: Bearer {KEY}", "Authorization: "),
        (f"b'Bearer {KEY}\\x01'", "Bearer "),
        (f"X-Api-Key: {API_SECRET}", "X-Api-Key: "),
        (f"x-api-key={API_SECRET}", "x-api-key="),
        (f"GET /v1/models?key={API_SECRET}&b=1", "&b=1"),
        (f"/x?api_key={API_SECRET}", "/x?api_key="),
        (f"/x?access_token={API_SECRET}#f", "#f"),
        (f"Basic {API_SECRET}", "Basic "),
        (f"the key {KEY} was used", " was used"),
        (f"cookie: a={API_SECRET}; b=2", "cookie: "),
    ],
)
def test_redact(text: str, kept: str) -> None:
    clean = redact(text)
    _no_secret(clean)
    assert REDACTED in clean and kept in clean


@pytest.mark.parametrize(
    "text",
    [
        'POST /v1/chat/completions 200 model="qwen3:8b" tokens=12',
        "daily token limit of 200 reached for key tk_ (prefix only)",
        "GET /admin/api/usage?since=24h&bucket=hour",
    ],
)
def test_redact_leaves_plain_text_alone(text: str) -> None:
    assert redact(text) == text


def test_handler_filter_redacts_any_logger(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("turnout.test.redaction")
    caplog.handler.addFilter(RedactingFilter())
    try:
        with caplog.at_level(logging.INFO, logger="turnout.test.redaction"):
            log.info("calling with %s", f"Authorization: Bearer {KEY}")
            try:
                raise ValueError(f"upstream refused key {KEY}")
            except ValueError:
                log.exception("request failed for %s", API_SECRET[:3])
    finally:
        caplog.handler.removeFilter(caplog.handler.filters[-1])
    _no_secret(caplog.text)
    assert "ValueError: upstream refused key tk_[redacted]" in caplog.text


def test_server_log_turns_a_parser_error_into_one_line(caplog: pytest.LogCaptureFixture) -> None:
    from aiohttp.http_exceptions import BadHttpMessage, InvalidHeader, LineTooLong

    adapter = ServerLog(logging.getLogger("turnout.test.server"))
    with caplog.at_level(logging.DEBUG, logger="turnout.test.server"):
        for exc in (
            InvalidHeader(f"Bearer {KEY}".encode()),
            LineTooLong(f"X-Api-Key: {API_SECRET}".encode(), 8190),
            BadHttpMessage(f"Invalid header value char:\n\n  b'{KEY}\\x01'\n      ^"),
        ):
            adapter.exception("Error handling request from %s", "127.0.0.1", exc_info=exc)
        try:
            raise RuntimeError(f"handler broke holding {KEY}")
        except RuntimeError as exc:
            adapter.exception("Unhandled exception", exc_info=exc)
    records = caplog.records
    assert [r.levelno for r in records] == [logging.INFO] * 3 + [logging.ERROR]
    for record in records[:3]:
        assert record.getMessage().startswith("malformed HTTP request from 127.0.0.1: 400 ")
        assert "\n" not in record.getMessage() and record.exc_info is None
    assert "invalid header" in records[0].getMessage()
    assert "Invalid header value char" in records[2].getMessage()
    assert "Traceback" in records[3].getMessage() and "tk_[redacted]" in records[3].getMessage()
    _no_secret(caplog.text)


async def test_any_runner_of_the_app_gets_the_safe_logs(
    gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """create_app's app logs safely under any runner (here the tests' own AppRunner, access log on by default)."""
    import asyncio

    gw = await gateway([], auth={"open": False})
    port = int(gw.url.rsplit(":", 1)[1])
    with caplog.at_level(logging.DEBUG, logger="aiohttp"):
        good = f"GET /v1/models?api_key={API_SECRET} HTTP/1.1\r\nHost: x\r\n{AUTH.decode()}Connection: close\r\n\r\n"
        answer = await asyncio.to_thread(_raw, port, good.encode())
        assert answer.startswith(b"HTTP/1.1 401")  # KEY is not a key of this gateway
        await asyncio.to_thread(_raw, port, MALFORMED["control byte in the Authorization value"])

        async def logged() -> bool:
            return any(r.name == "aiohttp.server" for r in caplog.records)

        await eventually(logged, "the malformed request's log line", limit_s=10)
    access = [r for r in caplog.records if r.name == "aiohttp.access"]
    server = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert len(access) == 1 and '"GET /v1/models?api_key=[redacted] HTTP/1.1" 401' in access[0].getMessage()
    assert len(server) == 1 and server[0].exc_info is None and server[0].levelno == logging.INFO
    assert server[0].getMessage().startswith("malformed HTTP request from 127.0.0.1: 400 ")
    _no_secret(caplog.text)
