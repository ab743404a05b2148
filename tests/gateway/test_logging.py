"""Logs never carry a secret: `turnout serve` as a user runs it, fed malformed and normal requests on a raw socket.

Each malformed request carries an ``Authorization: Bearer tk_...`` key and an ``X-Api-Key``-style secret; the
gateway must answer it (400) and log exactly one line about it, with no traceback and neither secret. Both of
aiohttp's HTTP parsers are exercised: the C one (default) and the pure-Python one (``AIOHTTP_NO_EXTENSIONS``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Engine, GatewayFactory, eventually, free_port
from tests.support.cli import TURNOUT
from turnout.redaction import REDACTED, RedactingFilter, ServerLog, redact

KEY_SECRET = "Zq9SeCrEtKeYvAlUe0123456789abcdefghijklmnop"  # 43 URL-safe characters, like a real key's tail
KEY = f"tk_{KEY_SECRET}"
API_SECRET = "sk-live-9f8e7d6c5b4a39281706"
SECRETS = (KEY_SECRET, API_SECRET, KEY_SECRET[:12], API_SECRET[-12:])
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Served:
    port: int
    log: Path
    key: str  # the starter key the gateway printed (a real, working key)
    proc: subprocess.Popen[bytes]

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def lines(self) -> list[str]:
        return self.text().splitlines()

    def stop(self) -> None:
        """SIGTERM, and wait: every line it logs is in the file afterwards."""
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(20)


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


def _ready(proc: subprocess.Popen[bytes], port: int, key: Callable[[], str | None]) -> bool:
    """It has exited, or printed its key (after binding its port) and answers /healthz there."""
    return proc.poll() is not None or (key() is not None and _healthy(port))


@contextmanager
def _serving(
    tmp_path: Path, *flags: str, config: dict[str, Any] | None = None, env: dict[str, str] | None = None
) -> Iterator[Served]:
    """``turnout serve`` as a user runs it (keys required), stderr (its log) to a file; stopped at the end. Ready
    once it printed its starter key (after it bound its port: the /healthz that answers then is its own, not another
    test's server on a port free_port handed out twice) and answers /healthz; a port taken meanwhile, another."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"storage": {"data_dir": "state"}, "workers": [], **(config or {})}))
    environ = {k: v for k, v in os.environ.items() if k not in ("TURNOUT_ADMIN_TOKEN", "AIOHTTP_NO_EXTENSIONS")}
    log = tmp_path / "serve.log"
    out = tmp_path / "serve.out"

    def key() -> str | None:
        return next((line.strip() for line in out.read_text().splitlines() if line.strip().startswith("tk_")), None)

    for _ in range(3):
        port = free_port()
        with log.open("wb") as err_file, out.open("wb") as out_file:
            proc = subprocess.Popen(
                [*TURNOUT, "serve", "-c", str(path), "--port", str(port), *flags],
                cwd=tmp_path,
                stdout=out_file,
                stderr=err_file,
                env={**environ, **(env or {})},
            )
        _until(partial(_ready, proc, port, key), "turnout serve to print its key and answer /healthz")
        if proc.poll() is None or "cannot listen on" not in log.read_text():
            break
    try:
        assert proc.poll() is None, log.read_text()
        starter = key()
        assert starter is not None
        yield Served(port, log, starter, proc)
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.fixture(params=["c-parser", "python-parser"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    env = {"AIOHTTP_NO_EXTENSIONS": "1"} if request.param == "python-parser" else {}
    with _serving(tmp_path, "--access-log", env=env) as gateway:
        yield gateway


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


# -- the access log and the log format, on the real `turnout serve` ------------------------------
def _call(served: Served, method: str, path: str, body: Any = None, key: str | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{served.port}{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _access(served: Served, count: int) -> list[str]:
    """Wait for ``count`` access lines (not counting the fixture's /healthz); return them (each still with its
    time, level and logger)."""

    def lines() -> list[str]:
        return [line for line in served.lines() if " turnout.access: " in line and "GET /healthz" not in line]

    _until(lambda: len(lines()) >= count, f"{count} access lines")
    return lines()


ACCESS_LINE = re.compile(
    r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO turnout\.access: 127\.0\.0\.1 "(?P<request>[^"]+)" (?P<status>\d{3}) '
    r"\d+ \d+\.\d{3}s(?P<rest>.*)$"
)


def _with_llama(engine: Engine, **more: Any) -> dict[str, Any]:
    return {"workers": [{"name": "llama", "url": engine.url, "type": "openai"}], **more}


def test_access_log_is_on_by_default_one_line_per_request(tmp_path: Path, llama_engine: Engine) -> None:
    """Who asked (key prefix, app), for what (api, model), where it went (worker), how it went (status, time,
    tokens, error code): one line per request, by default, never with a key."""
    with _serving(tmp_path, config=_with_llama(llama_engine)) as served:
        key = served.key
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        status, answer = _call(served, "POST", "/v1/chat/completions", chat, key)
        assert status == 200
        usage = json.loads(answer)["usage"]  # what the worker reported is what the line says
        ollama_chat = {**chat, "options": {"num_predict": 3}, "stream": True}
        assert _call(served, "POST", "/api/chat", ollama_chat, key)[0] == 200
        assert _call(served, "POST", "/v1/chat/completions", {**chat, "model": "nope"}, key)[0] == 404
        assert _call(served, "GET", "/v1/models", key=key)[0] == 200
        assert _call(served, "POST", "/v1/chat/completions", chat)[0] == 401
        lines = _access(served, 5)
    assert len(lines) == 5, lines
    parsed = [ACCESS_LINE.match(line) for line in lines]
    assert all(parsed), lines
    first, second, missing, models, anonymous = (m for m in parsed if m is not None)
    prefix = key[:10]  # what `turnout key list` shows
    assert first["request"] == "POST /v1/chat/completions HTTP/1.1" and first["status"] == "200"
    phases = r" queue=\d+\.\dms upstream=\d+\.\dms ttft=\d+\.\dms"  # where its time went, in milliseconds
    assert re.fullmatch(
        re.escape(
            f" key={prefix} app=starter api=openai:chat model=tiny worker=llama"
            f" tokens={usage['prompt_tokens']}+{usage['completion_tokens']}"
            ' route="only candidate"'  # why it went to that worker: the model has one
            " priority=standard"  # the class it was served at (the starter key's: neither it nor its tenant says)
        )
        + phases,
        first["rest"],
    ), first["rest"]
    assert second["request"] == "POST /api/chat HTTP/1.1" and second["status"] == "200"
    assert re.fullmatch(
        rf" key={prefix} app=starter api=ollama:chat model=tiny worker=llama tokens=\d+\+\d+"
        ' route="only candidate" priority=standard'
        + phases,  # a stream's too, though its header could not say its ttft
        second["rest"],
    ), second["rest"]
    assert missing["status"] == "404"
    assert re.fullmatch(
        re.escape(f" key={prefix} app=starter api=openai:chat model=nope worker=- tokens=0+0 priority=standard")
        + r" queue=\d+\.\dms error=model_not_found",  # it asked for a slot, and was routed nowhere
        missing["rest"],
    ), missing["rest"]
    assert models["request"] == "GET /v1/models HTTP/1.1" and models["rest"] == f" key={prefix} app=starter"
    assert anonymous["status"] == "401" and anonymous["rest"] == " error=missing_api_key"
    text = served.text()
    assert key not in text and key[3:] not in text and key[3:12] not in text


@pytest.mark.parametrize(
    ("flags", "logging_config", "logged"),
    [
        (("--no-access-log",), {}, False),
        ((), {"access_log": False}, False),
        (("--access-log",), {"access_log": False}, True),  # the flag wins over the config
    ],
)
def test_access_log_off_switch(
    tmp_path: Path, flags: tuple[str, ...], logging_config: dict[str, Any], logged: bool
) -> None:
    with _serving(tmp_path, *flags, config={"logging": logging_config}) as served:
        for _ in range(3):
            assert _call(served, "GET", "/v1/models", key=served.key)[0] == 200
        served.stop()  # everything it would log is in the file now
    assert served.text().count('"GET /v1/models HTTP/1.1" 200') == (3 if logged else 0), served.text()


@pytest.mark.parametrize("how", ["flag", "config"])
def test_json_log_format(tmp_path: Path, llama_engine: Engine, how: str) -> None:
    """Every record one JSON object per line: the start-up state changes, the access log with its fields."""
    dead = {"name": "dead", "url": f"http://127.0.0.1:{free_port()}", "type": "ollama"}
    config = _with_llama(llama_engine)
    config["workers"].append(dead)
    flags = ("--log-format", "json") if how == "flag" else ()
    if how == "config":
        config["logging"] = {"format": "json"}
    with _serving(tmp_path, *flags, config=config) as served:
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        status, answer = _call(served, "POST", "/v1/chat/completions", chat, served.key)
        assert status == 200
        usage = json.loads(answer)["usage"]
        # a model no healthy worker lists, while "dead" (never listed) may hold it: 503, not 404 (issue 32, item 1)
        assert _call(served, "POST", "/v1/chat/completions", {**chat, "model": "nope"}, served.key)[0] == 503
        served.stop()
    records = [json.loads(line) for line in served.lines()]  # every line is one JSON object
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
    down = [r for r in records if r["logger"] == "turnout.fleet" and r["message"].startswith('worker "dead" is down')]
    assert len(down) == 1 and down[0]["level"] == "WARNING"
    assert down[0]["message"].startswith('worker "dead" is down: connection refused [dead: cannot connect to ')
    access = [r for r in records if r["logger"] == "turnout.access" and r["path"] != "/healthz"]
    assert len(access) == 2, records
    ok, missing = access
    assert ok["method"] == "POST" and ok["path"] == "/v1/chat/completions" and ok["status"] == 200
    assert ok["key"] == served.key[:10] and ok["app"] == "starter" and ok["api"] == "openai:chat"
    assert ok["model"] == "tiny" and ok["worker"] == "llama" and ok["latency_ms"] > 0 and "error" not in ok
    assert (ok["prompt_tokens"], ok["completion_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert missing["status"] == 503 and missing["error"] == "no_healthy_worker" and missing["worker"] is None
    assert served.key not in served.text() and served.key[3:] not in served.text()
    # where its time went, in milliseconds (its total is latency_ms)
    assert ok["queue_ms"] >= 0 and ok["upstream_ms"] >= 0 and ok["ttft_ms"] > 0 and "hold_ms" not in ok
    # every field the access line has is one docs/api.md's Logs section names
    logs = (ROOT / "docs" / "api.md").read_text().split("\n## Logs\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`([a-z_]+)`", logs))
    fields = {f for r in access for f in r} - {"time", "level", "logger", "message"}
    assert fields <= documented, fields - documented


async def test_access_line_redacts_what_the_client_wrote(
    gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The line is safe as built (its path and model redacted), not only after the CLI's handler filter: here
    no filter runs (the tests' own runner and caplog's handler)."""
    import aiohttp

    gw = await gateway([])
    with caplog.at_level(logging.INFO, logger="aiohttp.access"):
        async with aiohttp.ClientSession() as http:
            body = {"model": f"stolen-{KEY}", "messages": []}
            async with http.post(f"{gw.url}/v1/chat/completions?api_key={API_SECRET}", json=body) as resp:
                assert resp.status == 503

            async def logged() -> bool:
                return any(r.name == "aiohttp.access" for r in caplog.records)

            await eventually(logged, "the access line", limit_s=10)
    (record,) = [r for r in caplog.records if r.name == "aiohttp.access"]
    line = record.getMessage()
    assert f"?api_key={REDACTED}" in line and f'model="stolen-tk_{REDACTED}"' in line, line
    assert "api=openai:chat" in line and "error=no_workers" in line
    assert record.model == f"stolen-tk_{REDACTED}"  # type: ignore[attr-defined]  # the JSON field too
    _no_secret(caplog.text)


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


async def test_a_client_that_gives_up_in_the_queue_has_its_access_line(
    gateway: GatewayFactory, emulator: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp writes no line for a request whose handler was cancelled: a client that gave up while its request
    waited left no trace. It is written as nginx would: 499, ``error=client_gone``, with the model asked for."""
    import asyncio

    import aiohttp

    from tests.conftest import worker

    emu = await emulator("slow", ["m:latest"], token_delay_s=0.3, tokens=10)  # 3 s an answer
    gw = await gateway([worker("slow", emu.url, max_concurrent=1)])
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    with caplog.at_level(logging.INFO, logger="aiohttp.access"):
        async with aiohttp.ClientSession() as http:
            busy = asyncio.create_task(http.post(f"{gw.url}/v1/chat/completions", json=body))
            await eventually(lambda: _async(emu.served() >= 1), "the first request at work")
            with pytest.raises(TimeoutError):  # the second waits for the slot; its client gives up
                async with http.post(
                    f"{gw.url}/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=0.5)
                ) as r:
                    await r.read()

            async def gone() -> list[str]:
                lines = [r.getMessage() for r in caplog.records if r.name == "aiohttp.access"]
                return [line for line in lines if " 499 " in line]

            (line,) = await eventually(gone, "the 499 line", limit_s=10)
            (await busy).close()
            async with http.get(f"{gw.url}/metrics") as r:
                scraped = await r.text()
    assert re.search(r'turnout_requests_total\{[^}]*status="499"[^}]*\} 1\.0', scraped), scraped[:2000]
    assert "error=client_gone" in line and " model=m " in line and "priority=standard" in line, line


async def _async(value: bool) -> bool:
    return value
