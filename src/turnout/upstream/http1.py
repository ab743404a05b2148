"""A small HTTP/1.1 client for the proxy hot path: keep-alive pool, streaming bodies, one timer per request.

Why not aiohttp's client here: per proxied request it costs more CPU than everything else Turnout does
(measured with bench/run.py), and the gateway only needs a narrow slice of HTTP: one request at a time per
connection, Content-Length request bodies, Content-Length / chunked / until-close responses, no redirects,
no cookies, no proxies. Parsing is done by ``httptools`` (llhttp, the parser behind uvicorn); this module
only owns connections, flow control and timeouts.

Errors: :class:`ConnectFailed` when nothing was sent (the caller may try another worker), otherwise
:class:`turnout.errors.UpstreamError`.

Response framing is what keeps one tenant's answer from reaching another, so it is strict:

* interim ``1xx`` heads (``100 Continue``, ``103 Early Hints``) are parsed and skipped; the final head that
  follows is the answer. ``101 Switching Protocols`` is an error (Turnout never asks to upgrade).
* a connection goes back to the pool only when its response was read completely and cleanly, with
  keep-alive, and nothing else arrived: bytes after the body (a second response, a body longer than its
  ``Content-Length``, garbage) poison the connection, and a pooled connection is checked for stray bytes
  (a zero-timeout poll of its socket) before it is reused.
"""

from __future__ import annotations

import asyncio
import ipaddress
import select
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import cast
from urllib.parse import urlsplit

import httptools

from turnout.core.ssrf import check_address, check_hostname
from turnout.errors import UpstreamError

__all__ = [
    "ConnectFailed",
    "Connection",
    "DialGuard",
    "DialRefused",
    "NoAnswer",
    "Pool",
    "Resolver",
    "Target",
    "split_url",
    "system_resolver",
]

_HIGH_WATER = 1 << 20  # pause reading a worker once this much body is waiting for a slow client
_IDLE_PER_HOST = 512


class ConnectFailed(UpstreamError):
    """The worker could not be reached at all; nothing was sent, another worker may be tried. ``connect_s``: how
    long trying took (set by :class:`turnout.upstream.client.UpstreamClient`)."""

    connect_s = 0.0


class NoAnswer(UpstreamError):
    """The request was sent, and the connection broke (closed, reset, not HTTP) before the answer's head: the
    worker's failure rather than the model's, but not safe to send elsewhere (the worker may have run it)."""


class DialRefused(ConnectFailed):
    """The SSRF guard refused every address the name resolved to; nothing was dialed."""


@dataclass(frozen=True, slots=True)
class DialGuard:
    """SSRF policy for one destination class (external endpoints): checked on the resolved address.
    ``nat64``: the NAT64 prefixes the operator declared (``network.nat64_prefixes``)."""

    allow_private: bool
    nat64: tuple[ipaddress.IPv6Network, ...] = ()


Resolver = Callable[[str, int], Awaitable[list[str]]]


async def system_resolver(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True, slots=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


@lru_cache(maxsize=4096)
def split_url(url: str) -> Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UpstreamError(f"unsupported upstream URL {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(parts.scheme, parts.hostname, port, path)


class Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request/response at a time."""

    def __init__(self, key: tuple[object, ...]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.poisoned = False  # something arrived that belongs to no request: never reuse
        self._poller: select.poll | None = None  # the socket's readability, checked before each reuse
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.content_type = ""
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.error: BaseException | None = None
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.received_any = False
        self._header_name = b""
        self._waiter: asyncio.Future[bool] | None = None
        self._until_eof = True
        self._interim = False

    def begin(self) -> None:
        """Prepare a reused connection for its next response."""
        self._reset()

    @property
    def reusable(self) -> bool:
        return (
            self.complete
            and not self.lost
            and not self.poisoned
            and self.error is None
            and self.transport is not None
            and not self.transport.is_closing()
            and self.keep_alive
        )

    def idle_and_clean(self) -> bool:
        """For a pooled connection: still open and nothing waiting to be read (no stray bytes, no EOF)."""
        if self.lost or self.poisoned or self.transport is None or self.transport.is_closing():
            return False
        poller = self._poller
        if poller is None:  # made once per connection: this runs before every reuse
            sock = self.transport.get_extra_info("socket")
            if sock is None:
                return False
            poller = self._poller = select.poll()
            poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        return not poller.poll(0)

    # -- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though not always a subclass of asyncio.Transport (uvloop's TCPTransport is not).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.complete or self.poisoned:  # the response was whole; anything more belongs to no request
            self._poison()
            return
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamError("the worker switched protocols (HTTP upgrade), which Turnout never asks for"))
            self.close()
        except httptools.HttpParserError as exc:
            if self.complete:  # garbage after a complete response: the response stands, the connection goes
                self._poison()
            else:
                self._fail(UpstreamError(f"invalid HTTP response: {exc}"))
                self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.complete and self.error is None:
            if self.headers_done and self._until_eof:
                self.complete = True  # body delimited by the end of the connection
            else:
                self.error = UpstreamError("connection closed by the worker" + (f": {exc}" if exc else ""))
        self._wake()

    def pause_writing(self) -> None:  # requests are small; nothing to throttle
        pass

    def resume_writing(self) -> None:
        pass

    # -- httptools callbacks -----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.complete:  # a second response in one read: poison (the current one stays complete)
            self.poisoned = True
            return
        self.content_type = ""
        self._until_eof = True
        self._header_name = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.complete:
            return
        if name:
            self._header_name = name.lower()
        field = self._header_name
        if field == b"content-type":
            self.content_type = value.decode("latin-1").split(";", 1)[0].strip().lower()
        elif field in (b"content-length", b"transfer-encoding"):
            self._until_eof = False

    def on_headers_complete(self) -> None:
        if self.complete:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            # An interim head (RFC 9110 15.2): skip it; the final head follows on the same connection.
            self._interim = True
            if status == 101:
                self._fail(UpstreamError("the worker switched protocols (101), which Turnout never asks for"))
            return
        self.status = status
        self.headers_done = True
        if status in (204, 304):
            self._until_eof = False
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.complete or self._interim:
            return
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        if self.complete:
            self.poisoned = True
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # only meaningful inside the callback
        self._wake()

    # -- used by the client ------------------------------------------------------------------------
    def _poison(self) -> None:
        self.poisoned = True
        self.close()
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    async def wait(self) -> bool:
        """Until something happens on the connection (True), or :meth:`interrupt` (False)."""
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        try:
            return await waiter
        finally:
            self._waiter = None

    def interrupt(self) -> bool:
        """End the current :meth:`wait` with False; False when nothing waits."""
        waiter = self._waiter
        if waiter is None or waiter.done():
            return False
        waiter.set_result(False)
        return True

    def take(self) -> bytes:
        chunk = b"".join(self.body) if len(self.body) > 1 else self.body[0]
        self.body.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return chunk

    def timed_out(self, label: str) -> None:
        self._fail(UpstreamError(f"{label}: timed out", code="timeout"))
        self.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()
        self.lost = True


class Pool:
    """Idle keep-alive connections per (scheme, host, port, guarded)."""

    def __init__(self, connect_timeout_s: float, resolver: Resolver = system_resolver) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.resolver = resolver
        self._idle: dict[tuple[object, ...], list[Connection]] = {}
        self._ssl: ssl.SSLContext | None = None

    async def _guarded_address(self, target: Target, guard: DialGuard, label: str) -> str:
        """Resolve and return the first address the guard allows; refuse when there is none."""
        named = check_hostname(target.host)
        if not named.allowed:
            raise DialRefused(f"{label}: refused to dial {target.host}: {named.reason}", code="dial_refused")
        try:
            # "host." is the same absolute name as "host"; some resolvers only know the dotless form.
            addresses = await self.resolver(target.host.rstrip(".") or target.host, target.port)
        except OSError as exc:
            raise ConnectFailed(
                f"{label}: cannot resolve {target.host}: {exc.strerror or exc}", code="dns_error"
            ) from None
        reasons = []
        always = False
        for address in addresses:
            verdict = check_address(address, allow_private=guard.allow_private, nat64=guard.nat64)
            if verdict.allowed:
                return address
            reasons.append(verdict.reason)
            always = always or verdict.always
        raise DialRefused(
            f"{label}: refused to dial {target.host}: " + ("; ".join(reasons) or "no address"),
            code="dial_refused" if always else "dial_refused_private",
        )

    async def connect(self, target: Target, label: str, guard: DialGuard | None = None) -> tuple[Connection, bool]:
        """(connection, reused). With a guard, the resolved address is checked and dialed directly."""
        key = (*target.key, guard)
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.idle_and_clean():
                conn.begin()
                return conn, True
            conn.close()
        loop = asyncio.get_running_loop()
        ctx = None
        if target.scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ctx = self._ssl
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                address = target.host if guard is None else await self._guarded_address(target, guard, label)
                _, conn = await loop.create_connection(
                    lambda: Connection(key),
                    address,
                    target.port,
                    ssl=ctx,
                    server_hostname=target.host if ctx else None,
                )
        except TimeoutError:
            raise ConnectFailed(
                f"{label}: cannot connect to {target.host}:{target.port}: timed out", code="timeout"
            ) from None
        except ssl.SSLError as exc:
            raise ConnectFailed(
                f"{label}: TLS handshake with {target.host} failed: {exc.reason}", code="tls_error"
            ) from None
        except OSError as exc:
            why = exc.strerror or str(exc) or type(exc).__name__
            code = "dns_error" if isinstance(exc, socket.gaierror) else "connect_refused"
            raise ConnectFailed(f"{label}: cannot connect to {target.host}:{target.port}: {why}", code=code) from None
        return conn, False

    def release(self, conn: Connection) -> None:
        if not conn.reusable:
            conn.close()
            return
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= _IDLE_PER_HOST:
            conn.close()
        else:
            idle.append(conn)

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def encode_request(method: str, target: Target, headers: Mapping[str, str] | None, body: bytes | None) -> bytes:
    lines = [f"{method} {target.path} HTTP/1.1", f"Host: {target.host_header}"]
    if headers:
        lines.extend(f"{k}: {v}" for k, v in headers.items())
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if body else head
